"""Test-wide settings, fixed once: 8 fake CPU devices and offline Hugging Face libraries."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

from absl import flags  # noqa: E402

# grain's multiprocessing reads absl flags; mark them parsed so pytest does not trip over it.
flags.FLAGS.mark_as_parsed()
