"""jaxrl.envs: multi-turn, tool-using environments and rollouts with exact tokens (issue 17).

Public API:
  Env, Action, StepResult, message_ids, prompt_ids, encode_text   (the environment protocol, base.py)
  ENVS, make_env, EnvFactory                                      (registry.py)
  TOOLS, Calculator, Search, ToolError, calculate                 (tools.py)
  ToolEnv, SearchEnv, oracle_actions, exact_match                 (search.py)
  FieldsEnv                                                       (fields.py: one field of a person, looked up)
  EpisodeBudget, Episodes, collect_episodes, scripted_episodes    (episodes.py)
  GymTextEnv, SkyRLTextEnv, TRLToolEnv                            (adapters*.py: other libraries' env APIs)

Dimension letters (`jaxrl.types`): B episodes (= P records × G), L row width, U turns.
"""

from jaxrl.envs.adapters_gym import GymTextEnv
from jaxrl.envs.adapters_skyrl import SkyRLTextEnv
from jaxrl.envs.adapters_trl import TRLToolEnv
from jaxrl.envs.base import Action, Env, StepResult, encode_text, message_ids, prompt_ids
from jaxrl.envs.episodes import EpisodeBudget, Episodes, collect_episodes, scripted_episodes
from jaxrl.envs.fields import FieldsEnv
from jaxrl.envs.registry import ENVS, EnvFactory, make_env
from jaxrl.envs.search import SearchEnv, ToolEnv, exact_match, normalize_answer, oracle_actions
from jaxrl.envs.tools import TOOLS, Calculator, Search, ToolError, calculate

__all__ = [
    "ENVS", "TOOLS", "Action", "Calculator", "Env", "EnvFactory", "EpisodeBudget", "Episodes", "FieldsEnv",
    "GymTextEnv", "Search", "SearchEnv", "SkyRLTextEnv", "StepResult", "TRLToolEnv", "ToolEnv", "ToolError",
    "calculate", "collect_episodes", "encode_text", "exact_match", "make_env", "message_ids", "normalize_answer",
    "oracle_actions", "prompt_ids", "scripted_episodes",
]
