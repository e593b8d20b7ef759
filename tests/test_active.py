"""Active pair selection: candidates from over-sampled answers, the most uncertain pairs plus a random share."""

import pytest
import torch

from rlhf.reward.active import CandidatePair, candidate_pairs, choose_pairs, select_pairs


def test_candidates_are_every_pair_of_distinct_non_empty_answers():
    candidates = candidate_pairs([["x", "y", "z", "x"], ["", "only"], ["p", "q"]])
    # prompt 0: 4 answers give 6 pairs, minus (0, 3) whose texts are equal; prompt 1: the empty answer pairs nothing
    assert candidates == [CandidatePair(0, 0, 1), CandidatePair(0, 0, 2), CandidatePair(0, 1, 2),
                          CandidatePair(0, 1, 3), CandidatePair(0, 2, 3), CandidatePair(2, 0, 1)]


def test_selection_takes_the_highest_disagreement_plus_the_random_share():
    spread = torch.tensor([0.01, 0.50, 0.02, 0.40, 0.03, 0.30, 0.04, 0.20, 0.05, 0.10])
    groups = list(range(10))  # one candidate per prompt
    selection = select_pairs(spread, groups, n=4, random_share=0.25, seed=0)
    assert len(selection.random) == 1 and len(selection.uncertain) == 3
    # the uncertain three are the three highest among those not drawn at random
    rest = [i for i in torch.argsort(spread, descending=True).tolist() if i not in selection.random]
    assert selection.uncertain == rest[:3]
    assert selection.random_share == pytest.approx(0.25)
    assert len(set(selection.all)) == 4


def test_random_share_is_a_uniform_draw_not_the_uncertain_ones():
    spread = torch.arange(100, dtype=torch.float)  # candidate i has disagreement i
    drawn = []
    for seed in range(50):
        drawn += select_pairs(spread, list(range(100)), n=10, random_share=0.5, seed=seed).random
    # a uniform draw averages about 49.5; the top-5 by disagreement would average 97
    assert 35 < sum(drawn) / len(drawn) < 65


def test_no_prompt_gives_more_than_its_share():
    spread = torch.tensor([0.9, 0.8, 0.7, 0.1, 0.05])
    groups = [0, 0, 0, 1, 2]
    selection = select_pairs(spread, groups, n=3, random_share=0.0)
    assert selection.uncertain == [0, 3, 4]  # prompt 0's best pair only, then the other prompts
    two_each = select_pairs(spread, groups, n=3, random_share=0.0, max_per_prompt=2)
    assert two_each.uncertain == [0, 1, 3]


def test_full_random_and_no_random_ends():
    spread = torch.tensor([0.3, 0.1, 0.2])
    assert select_pairs(spread, [0, 1, 2], n=2, random_share=0.0).uncertain == [0, 2]
    everything_random = select_pairs(spread, [0, 1, 2], n=2, random_share=1.0, seed=1)
    assert everything_random.uncertain == [] and len(everything_random.random) == 2
    with pytest.raises(ValueError):
        select_pairs(spread, [0, 1, 2], n=2, random_share=1.5)


class LengthDoubt:
    """A stand-in preference model: unsure exactly when both answers have the same length."""

    def disagreement(self, prompts, answers_a, answers_b):
        return torch.tensor([1.0 / (1 + abs(len(a) - len(b))) for a, b in zip(answers_a, answers_b)])


def test_choose_pairs_scores_every_candidate_with_the_model():
    prompts = ["p0", "p1"]
    answers = [["aa", "bb", "cccccc"], ["d", "eeeeeeeee"]]
    candidates, selection = choose_pairs(LengthDoubt(), prompts, answers, n=2, random_share=0.0)
    picked = [candidates[i] for i in selection.uncertain]
    # prompt 0: "aa" vs "bb" (same length) is the most uncertain; prompt 1 has a single candidate
    assert picked == [CandidatePair(0, 0, 1), CandidatePair(1, 0, 1)]


def test_make_active_pairs_stores_the_pairs_the_chooser_picks(tiny_model_dir):
    from annotate.store import Store
    from loop.pair_request import PairRequest
    from loop.pairs import make_active_pairs
    from rlhf.reward.config import VotesConfig
    from rlhf.sampling import Sampling

    store = Store(":memory:")
    store.add_prompts([f"Question number {i}?" for i in range(6)], source="test")
    policy = store.ensure_base_policy(str(tiny_model_dir))
    seen = {}

    def chooser(prompts, answers, n, seed):
        seen.update(prompts=prompts, answers=answers, n=n)
        return [(0, 0, 3), (2, 1, 2)], 1  # two pairs, the first chosen for uncertainty

    report = make_active_pairs(store, PairRequest(2, policy.id, sampling=Sampling(max_new_tokens=6), seed=0), chooser,
                               VotesConfig(oversample=4, prompts_per_pair=1.5))
    assert seen["n"] == 2 and len(seen["prompts"]) == 3  # ceil(2 * 1.5) prompts over-sampled
    assert all(len(answers) == 4 for answers in seen["answers"])
    assert report.written == 2 and report.stats["active/uncertain"] == 1.0
    stored = [store.pair(pair_id) for pair_id in range(1, store.count_pairs() + 1)]
    texts = [{store.generation(p.gen_a).text, store.generation(p.gen_b).text} for p in stored]
    assert texts == [{seen["answers"][0][0], seen["answers"][0][3]}, {seen["answers"][2][1], seen["answers"][2][2]}]
    assert all(p.kind == "sample" for p in stored)
    assert [p.chosen_by for p in stored] == ["uncertain", "random"]  # the chooser's uncertain ones come first


def test_make_active_pairs_seed_fixes_the_sampled_answers(tiny_model_dir):
    from annotate.store import Store
    from loop.pair_request import PairRequest
    from loop.pairs import make_active_pairs
    from rlhf.reward.config import VotesConfig
    from rlhf.sampling import Sampling

    def sampled(seed):
        store = Store(":memory:")
        store.add_prompts([f"Question number {i}?" for i in range(4)], source="test")
        policy = store.ensure_base_policy(str(tiny_model_dir))
        seen = []

        def chooser(prompts, answers, n, chooser_seed):
            seen.extend(answers)
            return [(0, 0, 1)], 0

        # the request's seed must fix the draws, as make_pairs does
        make_active_pairs(store, PairRequest(1, policy.id, sampling=Sampling(max_new_tokens=8, temperature=1.5),
                                             seed=seed), chooser, VotesConfig(oversample=4))
        return seen

    first = sampled(3)
    assert sampled(3) == first
    assert sampled(4) != first
