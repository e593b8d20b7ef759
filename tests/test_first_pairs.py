"""The first pairs come fast: answers are handed over as they end, the first chunk of a batch is small,
each pair is stored the moment its second answer ends, progress moves with every answer, and the app's status says
what the pair maker does and how long is left."""

import math
import threading

import pytest
import torch

from annotate.store import Store
from loop.children.pair_job import GenerationJob, duration_text
from loop.pair_request import PairProgress, PairRequest
from loop.pairs import chunk_sizes, make_pairs
from loop.policies import PolicyModel
from rlhf.generate import AnswerWatch, generate_answers
from rlhf.models import load_causal_lm
from rlhf.sampling import Sampling

pytestmark = pytest.mark.usefixtures("one_thread")

EOS_SHARE = 0.2
"""Chance that the ending model writes EOS at any step."""


@pytest.fixture(scope="module")
def ending_model(tiny_model_dir, real_tokenizer):
    """The tiny model made to draw, at every step and whatever came before, EOS with probability EOS_SHARE and else
    one of three words: answers end at random lengths, so the rows of a batch end at different steps."""
    model = load_causal_lm(tiny_model_dir)
    words = [real_tokenizer.encode(word, add_special_tokens=False)[0] for word in (" red", " green", " blue")]
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:  # no layer changes the residual stream...
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(model.config.vocab_size, hidden)
        model.model.embed_tokens.weight.fill_(1.0)  # ...which is then the same vector at every position
        state = model.model.norm(torch.ones(1, hidden))[0]
        unit = state / state.dot(state)  # head row = logit * unit gives that logit
        for word in words:
            head[word] = 20.0 * unit
        head[real_tokenizer.eos_token_id] = (20.0 + math.log(len(words) * EOS_SHARE / (1 - EOS_SHARE))) * unit
    model.lm_head.weight = torch.nn.Parameter(head)
    model.config.tie_word_embeddings = False
    return model


ENDING = Sampling(max_new_tokens=16, temperature=1.0, repetition_penalty=1.0)
ENDING_RUN = {"seed": 3, "batch_size": 8}
"""How ENDING's answers are generated: seeded, 8 sequences a batch."""
PROMPTS = ["Hi", "Why is the sky blue?", "Name a colour.", "Tell me more."]


def test_answers_are_handed_over_as_they_end_not_when_their_batch_does(ending_model, tokenizer):
    seen, progress = [], []

    class Watch(AnswerWatch):
        def answer(self, i, j, answer, done, total):
            seen.append((i, j, answer))
            progress.append((done, total))

    result = generate_answers(ending_model, tokenizer, PROMPTS, n_per_prompt=2, sampling=ENDING, **ENDING_RUN,
                              watch=Watch())

    assert sorted((i, j) for i, j, _ in seen) == [(i, j) for i in range(4) for j in range(2)]  # each once
    assert all(result.answers[i][j] == answer for i, j, answer in seen)
    # One batch of 8: the ones that ended with EOS come in the order they ended, the ones cut at the limit last.
    ended = [answer.n_tokens if answer.finish_reason == "stop" else math.inf for _, _, answer in seen]
    assert ended == sorted(ended)
    assert len({length for length in ended if length != math.inf}) > 2  # rows did end at different steps
    assert progress == [(done, 8) for done in range(1, 9)]
    # watching changes nothing that is sampled
    assert generate_answers(ending_model, tokenizer, PROMPTS, n_per_prompt=2, sampling=ENDING,
                            **ENDING_RUN).answers == result.answers


def test_each_decoding_step_is_counted_batch_by_batch(ending_model, tokenizer):
    steps = []

    class Watch(AnswerWatch):
        def step(self, step, most):
            steps.append((step, most))

    generate_answers(ending_model, tokenizer, PROMPTS, n_per_prompt=2, sampling=Sampling(max_new_tokens=5,
                     temperature=1.0), seed=0, batch_size=4, watch=Watch())
    assert {most for _, most in steps} == {5}
    batches = [i for i, (step, _) in enumerate(steps) if step == 1]
    assert len(batches) == 2 and batches[0] == 0  # 8 answers in batches of 4
    for begin, end in zip(batches, batches[1:] + [len(steps)]):
        assert [step for step, _ in steps[begin:end]] == list(range(1, end - begin + 1))


@pytest.mark.parametrize("n, largest, first, sizes", [
    (32, 8, 2, [2, 6, 8, 8, 8]),  # the app's first batch: 2 prompts, then the rest in as few chunks as can be
    (16, 8, 2, [2, 6, 8]),
    (5, 8, 2, [2, 3]),
    (1, 8, 2, [1]),
    (12, 4, 2, [2, 4, 4, 2]),
    (6, 1, 2, [1] * 6),
    (20, 64, 4, [4, 16]),
    (0, 8, 2, []),
])
def test_chunks_start_small_and_grow_to_full_batches(n, largest, first, sizes):
    assert chunk_sizes(n, largest, first) == sizes
    assert sum(sizes) == n and all(0 < size <= largest for size in sizes)


def test_the_first_pair_is_stored_before_the_rest_of_its_batch_is_answered(ending_model, tokenizer):
    with Store(":memory:") as store:
        store.add_prompts([f"Question number {i}?" for i in range(12)])
        base = store.ensure_base_policy("tiny")
        events = []
        add_pairs = store.add_pairs_bulk

        def add_pairs_bulk(pairs):
            events.append(("stored", len(pairs)))
            return add_pairs(pairs)

        store.add_pairs_bulk = add_pairs_bulk
        progress, answers = [], []

        class Recorded(PairProgress):
            def pairs(self, done, total, written):
                progress.append((done, total, store.count_pairs()))

            def answers(self, done, total):
                answers.append((done, total))
                events.append(("answer", done))

        request = PairRequest(12, base.id, sampling=ENDING, seed=0, batch_size=ENDING_RUN["batch_size"])
        report = make_pairs(store, request, PolicyModel(ending_model, tokenizer), Recorded())

        chunks = chunk_sizes(12, ENDING_RUN["batch_size"] // 2)
        assert chunks[0] == 2
        assert all(count == 1 for kind, count in events if kind == "stored")  # pair by pair
        # the first pair is in the store before the first chunk's (2 prompts, 4 answers) last answer has ended
        first_stored = events.index(("stored", 1))
        assert events[first_stored - 1][1] < 2 * chunks[0]
        # and every pair as soon as its second answer ends, not at the end of its chunk
        ends = {2 * sum(chunks[:k + 1]) for k in range(len(chunks))}
        stored_after = [events[i - 1][1] for i, event in enumerate(events) if event[0] == "stored"]
        assert any(done not in ends for done in stored_after)
        # progress per prompt and per answer, step by step up to the totals; pairs in the store as progress says
        assert [(done, total) for done, total, _ in progress] == [(done, 12) for done in range(1, 13)]
        assert [stored for *_, stored in progress] == sorted(stored for *_, stored in progress)
        assert progress[-1][2] == store.count_pairs() == report.written
        assert report.written + report.skipped_empty + report.skipped_identical == 12
        assert answers == [(done, 24) for done in range(1, 25)]


class SteppedGenerator:
    """A generator the test moves step by step: each step is a function of the reporter, run when told to; it returns
    when told once more (`finish`)."""

    def __init__(self):
        self.steps: list = []
        self.go = threading.Semaphore(0)
        self.done = threading.Semaphore(0)

    def generate(self, n_pairs, versus_share, progress):
        for step in self.steps:
            self.go.acquire()
            step(progress)
            self.done.release()
        self.go.acquire()
        return n_pairs

    def finish(self, job) -> None:
        self.go.release()
        job.wait(10)

    def step(self, job) -> str:
        self.go.release()
        assert self.done.acquire(timeout=10)
        return job.status_text()


def test_the_status_says_what_the_pair_maker_does_and_how_long_is_left():
    now = [100.0]
    generator = SteppedGenerator()
    generator.steps = [
        lambda reporter: reporter.stage("loading the model"),
        lambda reporter: now.__setitem__(0, 104.0),
        lambda reporter: reporter.stage("generating"),
        lambda reporter: now.__setitem__(0, 110.0),
        lambda reporter: (reporter.answers(3, 8), reporter(1, 4)),
        lambda reporter: now.__setitem__(0, 113.0),
        lambda reporter: now.__setitem__(0, 122.0),  # 9 s without news: 18 s for 3 answers, 30 for the 5 left
        lambda reporter: (reporter.answers(8, 8), reporter(4, 4)),
    ]
    job = GenerationJob(generator, clock=lambda: now[0])
    job.start(4, 0.0, started_by="first start")
    assert job.status_text() == "Preparing 4 pairs: starting, 0 s so far (started by first start)."
    assert generator.step(job) == "Preparing 4 pairs: loading the model, 0 s so far (started by first start)."
    assert "loading the model, 4 s so far" in generator.step(job)
    assert generator.step(job) == ("Generating pairs: 0/4 ready, writing the first answers, 4 s so far "
                                   "(started by first start).")
    assert "writing the first answers, 10 s so far" in generator.step(job)
    # 3 answers in the 6 s since generating began: 5 more take about 10 s
    assert generator.step(job) == "Generating pairs: 1/4 ready, 3/8 answers, about 10 s left (started by first start)."
    assert "about 7 s left" in generator.step(job)  # the estimate counts down
    assert "about 30 s left" in generator.step(job)  # ran out: the rate as of now
    assert generator.step(job) == "Generating pairs: 4/4 ready, 8/8 answers, finishing (started by first start)."
    generator.finish(job)
    assert job.status_text() == "Generated 4 pairs in 22 s."
    assert job.progress().seconds_left is None


def test_before_the_first_pair_the_status_bounds_the_wait_by_the_batchs_pace():
    now = [0.0]
    generator = SteppedGenerator()
    generator.steps = [
        lambda reporter: (reporter.stage("generating"), reporter.steps(100, 512, 0.05)),
        lambda reporter: now.__setitem__(0, 5.0),
        lambda reporter: (reporter.answers(2, 64), reporter(1, 32)),
    ]
    job = GenerationJob(generator, clock=lambda: now[0])
    job.start(32, 0.0, started_by="first start")
    # 412 tokens to go at 0.05 s a token: the batch, and with it the first pairs, ends within about 21 s
    assert generator.step(job) == ("Generating pairs: 0/32 ready, writing the first answers (token 100 of at most "
                                   "512): the first pairs within 21 s (started by first start).")
    assert "the first pairs within 16 s" in generator.step(job)  # 5 s later
    assert "1/32 ready, 2/64 answers, about 3 min left" in generator.step(job)  # 2 answers in 5 s, 62 to go
    generator.finish(job)


def test_the_child_prints_the_batchs_pace_about_once_a_second(capsys):
    from loop.children.pair_child import ChildLines

    now = [0.0]
    printer = ChildLines(clock=lambda: now[0])
    for step in range(1, 40):  # 0.125 s a step
        now[0] = step / 8
        printer.step(step, 512)
    printer.step(1, 512)  # the next batch starts, 0.5 s a step
    for step in range(2, 5):
        now[0] += 0.5
        printer.step(step, 512)
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [(word, int(step), int(most)) for word, step, most, _ in lines] == \
        [("pairs-step", step, 512) for step in (2, 10, 18, 26, 34, 2, 4)]
    assert [float(pace) for *_, pace in lines] == pytest.approx([0.125] * 5 + [0.5] * 2)


def test_a_generator_that_only_counts_pairs_gets_an_estimate_from_pairs():
    now = [0.0]
    generator = SteppedGenerator()
    generator.steps = [lambda reporter: (now.__setitem__(0, 20.0), reporter(2, 10))]
    job = GenerationJob(generator, clock=lambda: now[0])
    job.start(10, 0.0, started_by="alice")
    assert job.status_text().startswith("Preparing 10 pairs: starting")
    # a generator that never said it was generating: the rate counts from the start, 2 pairs in 20 s
    assert generator.step(job) == "Generating pairs: 2/10 ready, about 80 s left (started by alice)."
    now[0] = 30.0
    assert job.progress().seconds_left == pytest.approx(70.0)  # counted down from 80
    generator.finish(job)


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (42.4, "42 s"), (89, "89 s"), (90, "2 min"), (600, "10 min")])
def test_durations_read_as_people_say_them(seconds, text):
    assert duration_text(seconds) == text


def test_decoding_leaves_a_core_to_busy_neighbours_and_takes_it_back_when_they_are_quiet():
    from rlhf.cpu_threads import ThreadGovernor

    now, busy_own, threads = [0.0], [100.0, 10.0], []
    governor = ThreadGovernor(most=2, sample=lambda: tuple(busy_own), set_threads=threads.append,
                              clock=lambda: now[0])

    def one_second(others: float, own: float) -> list[int]:
        """A second in which the other processes kept `others` cores busy and this one `own`; then a step ends."""
        now[0] += 1.0
        busy_own[0] += others + own
        busy_own[1] += own
        governor(7, 512)
        return threads

    assert one_second(others=0.05, own=2.0) == []  # alone: every core, as torch started
    assert one_second(others=0.9, own=1.1) == [1]  # a busy neighbour: it gets a core
    assert one_second(others=0.6, own=1.0) == [1]
    assert one_second(others=0.1, own=1.0) == [1, 2]  # quiet again: the core comes back
    now[0] += 0.5  # between looks nothing is read or changed
    busy_own[0] += 5.0
    governor(8, 512)
    assert threads == [1, 2]


def test_where_nothing_tells_what_others_use_decoding_leaves_them_a_core():
    from rlhf.cpu_threads import ThreadGovernor, _busy_and_own_seconds

    threads = []
    ThreadGovernor(most=2, sample=lambda: None, set_threads=threads.append)
    ThreadGovernor(most=1, sample=lambda: None, set_threads=threads.append)  # one thread is the least
    assert threads == [1]
    measured = _busy_and_own_seconds()
    if measured is not None:  # Linux
        busy, own = measured
        assert busy >= own > 0
