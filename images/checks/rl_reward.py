"""The reward function of rl_check.py's main_ppo runs: no network, no model, standard library only.

verl loads it through `reward.custom_reward_function.path/name` (verl/trainer/ppo/reward.py,
get_custom_reward_fn) and its naive reward manager calls it once per response with keyword
arguments (verl/experimental/reward_loop/reward_manager/naive.py, run_single).

The score is the similarity of the response to the prompt's answer sentence (difflib's ratio, in
[0, 1]), not a 0/1 exact match: a random-init model never writes the answer, so an exact-match
reward would be 0 for every response of a group, GRPO's advantages all 0 and the policy loss
without gradient; a graded score differs between the samples of a prompt, so the actor really
updates. `exact` goes beside it (the naive manager keeps a dict's other keys as reward_extra_info).
"""

from __future__ import annotations

import difflib


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    answer = str(ground_truth).strip()
    response = str(solution_str).strip()
    return {
        "score": difflib.SequenceMatcher(None, response, answer, autojunk=False).ratio(),
        "exact": 1.0 if response == answer else 0.0,
    }
