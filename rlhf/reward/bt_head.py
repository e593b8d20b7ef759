"""Pure maths of the frozen-backbone reward model: Bradley-Terry heads on feature differences (torch only).

A head is a weight vector w; an answer with features f scores w . f, and P(a preferred to b) = sigmoid(w . (f_a - f_b)).
Fitting is L2-regularised logistic regression on the differences d = f_chosen - f_rejected with every label 1 and no
intercept (an intercept would only say "the first answer wins", which carries no meaning for an unordered pair):

    loss(w) = mean_i softplus(-d_i . w) + lam / 2 * |w|^2

Graded votes (rlhf.losses.graded_terms) give each vote a margin m_i, softplus(m_i - d_i . w), or a weight c_i.

convex, solved by damped Newton steps in float64. Features are standardised per dimension by the spread of the training
differences before the penalty applies, so one lam suits every layer; the returned weight acts on raw features.
The regularisation is chosen by k-fold cross-validation on the training votes (held-out log-likelihood), and an
ensemble of bootstrap heads measures how sure the model is about a pair (the spread of its members' P(a > b)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf.losses import bradley_terry_loss

DEFAULT_LAMBDAS = (1e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
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


def _objective(d: torch.Tensor, c: torch.Tensor, m: torch.Tensor, w: torch.Tensor, lam: float) -> float:
    return float(bradley_terry_loss(d @ w, m, c) + 0.5 * lam * w.pow(2).sum())


def _newton_step(d: torch.Tensor, curvature: torch.Tensor, lam: float, gradient: torch.Tensor) -> torch.Tensor:
    """H^-1 g for H = D^T diag(curvature) D + lam I, in whichever of N x N or D x D is smaller.

    With fewer votes than feature dimensions (the usual case here) Woodbury's identity gives
    H^-1 g = (g - D^T (lam diag(1/curvature) + D D^T)^-1 D g) / lam, an N x N solve.
    """
    n, dim = d.shape
    if n < dim:
        inner = torch.diag(lam / curvature) + d @ d.T  # (N, N)
        return (gradient - d.T @ torch.linalg.solve(inner, d @ gradient)) / lam  # (D,)
    hessian = d.T @ (d * curvature[:, None]) + lam * torch.eye(dim, dtype=d.dtype)  # (D, D)
    return torch.linalg.solve(hessian, gradient)  # (D,)


def fit_logistic(diffs: torch.Tensor, lam: float, weights: torch.Tensor | None = None,
                 max_iter: int = 50, init: torch.Tensor | None = None, tol: float = 1e-8,
                 margins: torch.Tensor | None = None) -> torch.Tensor:
    """argmin_w mean_i c_i softplus(m_i - d_i . w) + lam/2 |w|^2 on (already scaled) differences (N, D) -> (D,).

    Damped Newton steps (the objective is strictly convex): gradient g = -D^T (c * sigmoid(-z)) + lam w and Hessian
    H = D^T diag(c * s (1 - s)) D + lam I with z = D w - m, s = sigmoid(z); a step is halved until the objective falls.
    A handful of steps converge, far fewer passes than first-order solvers need at small lam.
    `weights` c_i (N,) lets a bootstrap count a resampled vote several times without copying rows; `init` (D,)
    warm-starts the solver (cross-validation walks the lambdas from strong to weak, each from the last solution).
    `margins` m_i (N,) default to 0 (a graded vote's margin in score units).
    """
    d = diffs.double()  # (N, D)
    c = torch.ones(d.shape[0], dtype=torch.float64) if weights is None else weights.double()  # (N,)
    c = c / c.sum()
    m = torch.zeros(d.shape[0], dtype=torch.float64) if margins is None else margins.double()  # (N,)
    w = torch.zeros(d.shape[1], dtype=torch.float64) if init is None else init.double().clone()  # (D,)
    value = _objective(d, c, m, w, lam)
    for _ in range(max_iter):
        s = torch.sigmoid(d @ w - m)  # (N,)
        gradient = -(d.T @ (c * (1 - s))) + lam * w  # (D,)
        if float(gradient.abs().max()) < tol:
            break
        curvature = (c * s * (1 - s)).clamp(min=1e-300)  # (N,)
        step = _newton_step(d, curvature, lam, gradient)  # (D,)
        size = 1.0
        while size > 1e-6:
            candidate = w - size * step
            candidate_value = _objective(d, c, m, candidate, lam)
            if candidate_value <= value:
                break
            size /= 2
        w, improvement, value = candidate, value - candidate_value, candidate_value
        if improvement < tol * max(1.0, abs(value)):
            break
    return w


def fold_indices(n: int, k: int, seed: int) -> list[torch.Tensor]:
    """k disjoint folds of a seeded permutation of range(n) (sizes differ by at most one)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [order[i::k] for i in range(k)]


def cross_validate(diffs: torch.Tensor, lambdas=DEFAULT_LAMBDAS, k: int = 5, seed: int = 0,
                   weights: torch.Tensor | None = None, margins: torch.Tensor | None = None) -> dict[float, float]:
    """Mean held-out log-likelihood of each lambda over k folds of the (scaled) differences.

    Log-likelihood rather than accuracy: with tens of votes accuracy moves in steps of a few percent and ties often.
    Graded votes' `weights` and `margins` (N,) shape the fits; the held-out folds are scored by the plain
    likelihood of their order, what the head is for.
    """
    n = diffs.shape[0]
    k = max(2, min(k, n))
    folds = fold_indices(n, k, seed)
    result = {lam: 0.0 for lam in lambdas}
    for fold in folds:
        train = torch.ones(n, dtype=torch.bool)
        train[fold] = False
        w = None
        for lam in sorted(lambdas, reverse=True):  # strong to weak: each solution starts the next
            w = fit_logistic(diffs[train], lam, init=w, weights=None if weights is None else weights[train],
                             margins=None if margins is None else margins[train])  # (D,)
            result[lam] += float(-torch.nn.functional.softplus(-(diffs[fold].double() @ w)).sum()) / n
    return result


def fit_head(diffs: torch.Tensor, lam: float | None = None, lambdas=DEFAULT_LAMBDAS, k: int = 5,
             seed: int = 0, weights: torch.Tensor | None = None, margins: torch.Tensor | None = None) -> HeadFit:
    """A head on differences f_chosen - f_rejected (N, D); lam None: chosen by k-fold cross-validation.
    `weights` and `margins` (N,): graded votes (fit_logistic)."""
    scale = feature_scale(diffs)  # (D,)
    scaled = diffs.double() / scale  # (N, D)
    cv = {}
    if lam is None:
        cv = cross_validate(scaled, lambdas, k, seed, weights, margins)
        lam = max(cv, key=cv.get)
    w = fit_logistic(scaled, lam, weights=weights, margins=margins)  # (D,) on scaled features
    return HeadFit(weight=w / scale, lam=lam, cv_loglik=cv)


def fit_bootstrap_heads(diffs: torch.Tensor, lam: float, n_heads: int, seed: int = 0,
                        weights: torch.Tensor | None = None, margins: torch.Tensor | None = None) -> torch.Tensor:
    """n_heads heads, each on a bootstrap resample of the votes (same lam): (H, D) weights on raw features.
    `weights` and `margins` (N,): graded votes (fit_logistic)."""
    scale = feature_scale(diffs)  # (D,)
    scaled = diffs.double() / scale  # (N, D)
    generator = torch.Generator().manual_seed(seed)
    heads = []
    for _ in range(n_heads):
        draws = torch.randint(0, diffs.shape[0], (diffs.shape[0],), generator=generator)  # (N,)
        counts = torch.bincount(draws, minlength=diffs.shape[0]).double()  # (N,) times each vote was drawn
        counts = counts if weights is None else counts * weights.double()
        heads.append(fit_logistic(scaled, lam, weights=counts, margins=margins) / scale)
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
