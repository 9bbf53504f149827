"""cpudist: data-parallel fine-tuning of transformers on clusters of CPU servers."""

__version__ = "0.1.0"
