"""Ready-made YAML configs, installed as package data of `jaxrl.configs` (the embedded default is quickstart.yaml)."""
