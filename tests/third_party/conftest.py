# Upstream suites vendored byte for byte: pytest never collects them; tests/libraries/ runs each through
# jitgrad's import shim in a subprocess.
collect_ignore_glob = ["*"]
