"""`bench spec`'s bookkeeping on a made-up report (the benchmark itself is not a test)."""

from __future__ import annotations

from llmlab.bench.spec import print_table, spec_configs, stops_paying


def _row(tps, acc=0.5):
    return {"tok_per_s": tps, "acceptance_rate": acc, "mean_acceptance_length": 1 + 2 * acc}


def test_stops_paying_is_the_first_batch_where_plain_is_faster(capsys):
    rows = {
        "repetitive": {
            "1": {"plain": _row(60), "ngram": _row(110)},
            "8": {"plain": _row(300), "ngram": _row(330)},
            "32": {"plain": _row(600), "ngram": _row(540)},
            "64": {"plain": _row(700), "ngram": _row(720)},
        }
    }
    assert stops_paying(rows, "repetitive", "ngram", [1, 8, 32, 64]) == 32
    assert stops_paying(rows, "repetitive", "ngram", [1, 8]) is None
    report = {
        "rows": rows,
        "machine": {"cpu": "x", "threads": 2},
        "settings": {"max_tokens": 8, "speculative_configs": {"plain": None, "ngram": {}}},
        "stops_paying_at_batch": {"repetitive": {"ngram": 32}},
    }
    print_table(report)
    out = capsys.readouterr().out
    assert "1.83x" in out and "stops paying at batch ngram 32" in out


def test_spec_configs_use_vllm_keys():
    cfg = spec_configs(3, 6)
    assert cfg["plain"] is None
    assert cfg["ngram"]["num_speculative_tokens"] == 3 and cfg["ngram"]["prompt_lookup_max"] == 4
    assert cfg["draft_model"]["draft_num_layers"] == 6
