"""Request shapes: length distributions of random prompts, sampling fields and --extra-body on every
request, and non-streaming requests (TTFT n/a), on the scripted server."""

import json

from ladder_harness import load_records, load_rungs


def test_lengths_spread_over_the_range_ratio(fake_server, ladder):
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--c", "2", "--prompts-per-rung", "24", "--warmup", "0",
                                 "--input-len", "60", "--output-len", "20", "--range-ratio", "0.5")
    assert code == 0, (out, err)
    records = load_records(run)
    outs = [r["max_tokens"] for r in records]
    assert all(10 <= n <= 30 for n in outs) and len(set(outs)) > 3
    assert all(r["completion_tokens"] == r["max_tokens"] for r in records)  # ignore_eos: each its own length
    ins = [r["prompt_tokens"] for r in records]
    assert len(set(ins)) > 3 and min(ins) < 50 < 70 < max(ins)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["workload"]["length_dist"] == {"kind": "uniform", "range_ratio": 0.5}


def test_sampling_fields_and_extra_body_reach_every_request(fake_server, ladder):
    want = {"top_p": 0.9, "top_k": 5, "seed": 7, "min_p": 0.1, "temperature": 0.5}
    url = fake_server(require=want)
    code, out, err, run = ladder("--base-url", url, "--c", "1", "--prompts-per-rung", "2", "--output-len", "3",
                                 "--top-p", "0.9", "--top-k", "5", "--request-seed", "7",
                                 "--extra-body", '{"min_p": 0.1, "temperature": 0.5}')
    assert code == 0, (out, err)
    sampling = json.loads((run / "manifest.json").read_text())["workload"]["sampling"]
    assert {k: sampling[k] for k in want} == want  # --extra-body overrides the ladder's temperature


def test_extra_body_that_is_not_json_is_a_one_line_error(ladder):
    code, out, err, run = ladder("--base-url", "http://127.0.0.1:9", "--extra-body", "{min_p: 0.1}")
    assert code == 2 and err.count("\n") == 1 and "--extra-body" in err and "Traceback" not in err


def test_non_streaming_requests_report_ttft_as_n_a(fake_server, ladder):
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--c", "2", "--prompts-per-rung", "4", "--output-len", "5",
                                 "--no-stream", "--goodput", "e2el:5000")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    assert rung["stats"]["ttft_ms"] is None and rung["stats"]["tpot_ms"] is None
    assert rung["stats"]["e2e_ms"]["mean"] > 0 and rung["stats"]["goodput_fraction"] == 1.0
    records = load_records(run)
    assert all(r["ttft_ms"] is None and r["completion_tokens"] == 5 and not r["streamed"] for r in records)
