"""jitgrad.utils.data: datasets, samplers and the DataLoader, as torch.utils.data."""
from jitgrad.utils.data.collate import default_collate, default_convert  # noqa: F401
from jitgrad.utils.data.dataloader import DataLoader, get_worker_info  # noqa: F401
from jitgrad.utils.data.dataset import (  # noqa: F401
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from jitgrad.utils.data.distributed import DistributedSampler  # noqa: F401
from jitgrad.utils.data.sampler import (  # noqa: F401
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
