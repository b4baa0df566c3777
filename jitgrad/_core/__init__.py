"""The bottom layer: layout, dtypes, modes, versions. Imports nothing else of jitgrad."""
