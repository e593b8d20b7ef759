"""The reward stage's check of each annotator where nobody else voted on their pairs: the share of their a/b votes that
a head fitted on everyone else's votes agrees with (rlhf.reward.annotator_agreement), on the round's frozen feature
and its feature cache, recorded with the round for the people table (annotate.people)."""

from __future__ import annotations

from dataclasses import replace

from annotate.records import VoteTexts


def model_agreement(voted: list[VoteTexts], model, config) -> dict[str, list[int]]:
    """{annotator: [votes agreed with, a/b votes]} of every vote in `voted` (Store.ab_vote_texts()), each annotator's
    head fitted by the head strategy on the others' votes, on `model`'s (a TrainedPreferenceModel) frozen feature;
    `config` is the round's StrategyConfig (its cross-validated L2, no bootstrap heads)."""
    from rlhf.reward.annotator_agreement import held_out_agreement
    from rlhf.reward.strategies import fit_feature_heads

    if not voted:
        return {}
    prompts = [vote.prompt for vote in voted]
    chosen = model.extractor.features(prompts, [vote.chosen for vote in voted], model.feature)  # (N, D)
    rejected = model.extractor.features(prompts, [vote.rejected for vote in voted], model.feature)  # (N, D)
    one_head = replace(config, votes=replace(config.votes, n_heads=0))

    def fit(train_chosen, train_rejected):
        return fit_feature_heads(train_chosen, train_rejected, "head", one_head)[0]  # (D,)

    measured = held_out_agreement(chosen, rejected, [vote.annotator for vote in voted], fit)
    return {name: [agreeing, judged] for name, (agreeing, judged) in measured.items()}
