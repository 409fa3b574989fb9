"""jaxrl.losses.research: the seed papers' reward arithmetic that `jaxrl train` does not use yet.

Each module matches its reference code (tests/losses/test_<name>.py) and is kept here, out of the trainer's
`jaxrl.losses` namespace, until a pipeline calls it:

| module | what | used by |
|---|---|---|
| `evpv` | EVPV-PRM premise reliability gate on process-reward-model step rewards | nothing yet (issue: multi-agent systems, item 6) |
| `proxy_grm` | Proxy-GRM proxy reward coupling | nothing yet (same issue, item 6) |
| `march` | MARCH solver / checker rewards (fact-check votes) | nothing yet (the MARCH pipeline, same issue) |
| `ssp` | SSP search self-play solver / proposer rewards | nothing yet (the SSP pipeline, same issue) |
| `multi_reward` | multi-reward weighting (risk / redundancy / weakness factors, frozen-reference normalisation) | nothing yet |

OpenRS's pairwise judge (`jaxrl.losses.openrs`) is used by the `pairwise` reward type and stays in `jaxrl.losses`.
"""

from jaxrl.losses.research import evpv, march, multi_reward, proxy_grm, ssp

__all__ = ["evpv", "march", "multi_reward", "proxy_grm", "ssp"]
