"""jaxrl: JAX/TPU-native reinforcement-learning post-training of language models."""

__version__ = "0.1.0"
