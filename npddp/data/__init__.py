"""Data for training: the per-rank sampler, mini-batch iteration and data sets.

Nothing here knows about MPI: the sampler takes ``num_replicas`` and ``rank`` as plain ints.
"""

from npddp.data.arrays import DataFileError, load_array_file
from npddp.data.dataset import Dataset
from npddp.data.datasets import DATASET_NAMES, DEFAULT_IMAGE_SHAPE, load_dataset, load_digits
from npddp.data.loader import BatchLoader, iterate_batches, num_batches
from npddp.data.mnist import MNIST_FILES, load_mnist, read_idx
from npddp.data.normalize import NORMALIZE_MODES, normalize, unscaled_reason
from npddp.data.sampler import DistributedSampler
from npddp.data.synthetic import synthetic_classification, synthetic_regression
from npddp.data.tokens import load_text_file, load_token_file, synthetic_tokens, windows

__all__ = [
    "DATASET_NAMES", "DEFAULT_IMAGE_SHAPE", "MNIST_FILES", "NORMALIZE_MODES", "BatchLoader", "DataFileError", "Dataset",
    "DistributedSampler", "iterate_batches", "load_array_file", "load_dataset", "load_digits",
    "load_mnist", "normalize", "num_batches", "read_idx", "synthetic_classification", "synthetic_regression",
    "unscaled_reason", "load_token_file", "load_text_file", "synthetic_tokens", "windows",
]
