"""Data for training: the per-rank sampler, mini-batch iteration and data sets.

Nothing here knows about MPI: the sampler takes ``num_replicas`` and ``rank`` as plain ints.
"""

from .arrays import DataFileError, load_array_file
from .dataset import Dataset
from .datasets import DATASET_NAMES, DEFAULT_IMAGE_SHAPE, load_dataset, load_digits
from .loader import BatchLoader, iterate_batches, num_batches
from .mnist import MNIST_FILES, load_mnist, read_idx
from .normalize import NORMALIZE_MODES, normalize, unscaled_reason
from .sampler import DistributedSampler
from .synthetic import synthetic_classification, synthetic_regression
from .tokens import load_text_file, load_token_file, synthetic_tokens, windows

__all__ = [
    "DATASET_NAMES", "DEFAULT_IMAGE_SHAPE", "MNIST_FILES", "NORMALIZE_MODES", "BatchLoader", "DataFileError", "Dataset",
    "DistributedSampler", "iterate_batches", "load_array_file", "load_dataset", "load_digits",
    "load_mnist", "normalize", "num_batches", "read_idx", "synthetic_classification", "synthetic_regression",
    "unscaled_reason", "load_token_file", "load_text_file", "synthetic_tokens", "windows",
]
