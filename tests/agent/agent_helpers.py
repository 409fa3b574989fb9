"""Shared pieces of the agent tests: a tiny model for the character tokenizer and a scripted environment."""

from __future__ import annotations

from flax import nnx

from jaxrl.envs import Action, StepResult, encode_text, prompt_ids
from jaxrl.models import Transformer, TransformerConfig


def tiny_model(seed: int = 0) -> Transformer:
    """2 layers, D=32, vocab 128 (the character tokenizer has 102 tokens), 512 positions."""
    cfg = TransformerConfig.tiny(vocab_size=128, max_position_embeddings=512)
    return Transformer(cfg, rngs=nnx.Rngs(seed))


class EchoEnv:
    """Ends after `record["turns"]` turns whatever the model writes; observation k of an episode is the text
    `record["obs"][k]`; reward k = 0.1·(k + 1) + 0.01·len(action), so per-turn rewards are checkable."""

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stop_strings, self.k, self.record = tokenizer, tuple(stops), 0, None

    def reset(self, record):
        self.record, self.k = record, 0
        return prompt_ids(self.tokenizer, [{"role": "user", "content": record["question"]}])

    def step(self, action: Action) -> StepResult:
        self.k += 1
        reward = 0.1 * self.k + 0.01 * len(action.ids)
        done = self.k >= self.record["turns"]
        obs = [] if done else encode_text(self.tokenizer, self.record["obs"][self.k - 1])
        return StepResult(obs, reward, done, {"tool_calls": 1, "tool_errors": int(self.k == 2)})
