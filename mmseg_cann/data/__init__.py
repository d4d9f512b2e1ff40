"""Synthetic datasets in the exact on-disk layout of the datasets mmseg reads."""
from .synthetic import DATASETS, make_dataset

__all__ = ['DATASETS', 'make_dataset']
