"""Pure maths of the frozen-backbone reward model: Bradley-Terry heads on feature differences (torch only).

A head is a weight vector w; an answer with features f scores w . f, and P(a preferred to b) = sigmoid(w . (f_a - f_b)).
Fitting is L2-regularised logistic regression on the differences d = f_chosen - f_rejected with every label 1 and no
intercept (an intercept would only say "the first answer wins", which carries no meaning for an unordered pair):

    loss(w) = mean_i softplus(-d_i . w) + lam / 2 * |w|^2

convex, solved by LBFGS in float64. Features are standardised per dimension by the spread of the training
differences before the penalty applies, so one lam suits every layer; the returned weight acts on raw features.
The regularisation is chosen by k-fold cross-validation on the training votes (held-out log-likelihood), and an
ensemble of bootstrap heads measures how sure the model is about a pair (the spread of its members' P(a > b)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_LAMBDAS = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)
"""Grid for cross-validation: from nearly unregularised to a head that barely leaves zero."""


@dataclass
class HeadFit:
    """A fitted Bradley-Terry head and how its regularisation was chosen."""

    weight: torch.Tensor
    """(D,) float64: score of an answer = raw features @ weight."""
    lam: float
    """L2 strength used (on standardised features)."""
    cv_loglik: dict[float, float]
    """Mean held-out log-likelihood per lambda tried (empty when lam was given)."""


def feature_scale(diffs: torch.Tensor) -> torch.Tensor:
    """Per-dimension root mean square of the differences, floored so constant dimensions do not divide by 0.  (D,)"""
    rms = diffs.double().pow(2).mean(0).sqrt()  # (D,)
    return rms.clamp(min=1e-6 * float(rms.max().clamp(min=1e-12)))


def fit_logistic(diffs: torch.Tensor, lam: float, weights: torch.Tensor | None = None,
                 max_iter: int = 200) -> torch.Tensor:
    """argmin_w mean_i c_i softplus(-d_i . w) + lam/2 |w|^2 on (already scaled) differences (N, D) -> (D,).

    `weights` c_i (N,) lets a bootstrap count a resampled vote several times without copying rows.
    """
    d = diffs.double()  # (N, D)
    c = torch.ones(d.shape[0], dtype=torch.float64) if weights is None else weights.double()  # (N,)
    c = c / c.sum()
    w = torch.zeros(d.shape[1], dtype=torch.float64, requires_grad=True)  # (D,)
    optimizer = torch.optim.LBFGS([w], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                                  history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (c * torch.nn.functional.softplus(-(d @ w))).sum() + 0.5 * lam * w.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach()


def fold_indices(n: int, k: int, seed: int) -> list[torch.Tensor]:
    """k disjoint folds of a seeded permutation of range(n) (sizes differ by at most one)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [order[i::k] for i in range(k)]


def cross_validate(diffs: torch.Tensor, lambdas=DEFAULT_LAMBDAS, k: int = 5, seed: int = 0) -> dict[float, float]:
    """Mean held-out log-likelihood of each lambda over k folds of the (scaled) differences.

    Log-likelihood rather than accuracy: with tens of votes accuracy moves in steps of a few percent and ties often.
    """
    n = diffs.shape[0]
    k = max(2, min(k, n))
    folds = fold_indices(n, k, seed)
    result = {}
    for lam in lambdas:
        total = 0.0
        for fold in folds:
            train = torch.ones(n, dtype=torch.bool)
            train[fold] = False
            w = fit_logistic(diffs[train], lam)  # (D,)
            total += float(-torch.nn.functional.softplus(-(diffs[fold].double() @ w)).sum())
        result[lam] = total / n
    return result


def fit_head(diffs: torch.Tensor, lam: float | None = None, lambdas=DEFAULT_LAMBDAS, k: int = 5,
             seed: int = 0) -> HeadFit:
    """A head on differences f_chosen - f_rejected (N, D); lam None: chosen by k-fold cross-validation."""
    scale = feature_scale(diffs)  # (D,)
    scaled = diffs.double() / scale  # (N, D)
    cv = {}
    if lam is None:
        cv = cross_validate(scaled, lambdas, k, seed)
        lam = max(cv, key=cv.get)
    w = fit_logistic(scaled, lam)  # (D,) on scaled features
    return HeadFit(weight=w / scale, lam=lam, cv_loglik=cv)


def fit_bootstrap_heads(diffs: torch.Tensor, lam: float, n_heads: int, seed: int = 0) -> torch.Tensor:
    """n_heads heads, each on a bootstrap resample of the votes (same lam): (H, D) weights on raw features."""
    scale = feature_scale(diffs)  # (D,)
    scaled = diffs.double() / scale  # (N, D)
    generator = torch.Generator().manual_seed(seed)
    heads = []
    for _ in range(n_heads):
        draws = torch.randint(0, diffs.shape[0], (diffs.shape[0],), generator=generator)  # (N,)
        counts = torch.bincount(draws, minlength=diffs.shape[0]).double()  # (N,) times each vote was drawn
        heads.append(fit_logistic(scaled, lam, weights=counts) / scale)
    return torch.stack(heads)  # (H, D)


def member_probs(heads: torch.Tensor, features_a: torch.Tensor, features_b: torch.Tensor) -> torch.Tensor:
    """P(a > b) under each head: (H, D), (N, D), (N, D) -> (H, N)."""
    return torch.sigmoid((features_a.double() - features_b.double()) @ heads.double().T).T  # (H, N)


def ensemble_disagreement(heads: torch.Tensor, features_a: torch.Tensor, features_b: torch.Tensor) -> torch.Tensor:
    """Standard deviation over heads of P(a > b) per pair (N,): high where the votes have not pinned the order."""
    return member_probs(heads, features_a, features_b).std(dim=0, unbiased=False)  # (N,)


def pair_accuracy(weight: torch.Tensor, features_chosen: torch.Tensor, features_rejected: torch.Tensor) -> float:
    """Share of pairs whose chosen answer scores strictly higher under `weight` (D,)."""
    margin = (features_chosen.double() - features_rejected.double()) @ weight.double()  # (N,)
    return float((margin > 0).double().mean())
