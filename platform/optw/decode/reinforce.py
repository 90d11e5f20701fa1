"""The REINFORCE loss on a rollout's outputs, written once for training, packs and active
search: each tourist's mean reward is its routes' baseline (the paper's Algorithms 1 and 2) and an
entropy bonus is subtracted, ``-((R - mean_tourist R) · log p).mean() - beta · entropy.mean()``.
With ``advantage = "normalised"``, each tourist's advantages are divided by the standard
deviation of its routes' rewards, so that every tourist (and region) of a mixed batch weighs
alike whatever the scale of its scores (RouteFinder's per-variant reward normalisation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ReinforceLoss:
    """The loss, and what a training loop reports: ``reward[K, B]`` and the mean entropy."""

    loss: torch.Tensor
    reward: torch.Tensor
    entropy: torch.Tensor


def reinforce_loss(reward: torch.Tensor, log_prob: torch.Tensor, entropy: torch.Tensor,
                   routes_per_tourist: int, beta: float = 0.0, advantage: str = "mean",
                   ) -> ReinforceLoss:
    """REINFORCE over routes grouped by tourist (``routes_per_tourist`` consecutive routes each;
    ``reward``, ``log_prob``, ``entropy`` [R], as a :class:`~optw.decode.core.Rollout` gives)."""
    per_tourist = reward.view(-1, routes_per_tourist)
    centred = per_tourist - per_tourist.mean(dim=1, keepdim=True)
    if advantage == "normalised":  # a tourist whose routes all score alike keeps its zeros
        centred = centred / (centred.std(dim=1, keepdim=True) + 1e-8)
    policy_loss = -(centred.view(-1).detach() * log_prob).mean()
    mean_entropy = entropy.mean()
    return ReinforceLoss(policy_loss - beta * mean_entropy, per_tourist, mean_entropy)
