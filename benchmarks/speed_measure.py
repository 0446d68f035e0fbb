"""speed.py's measurements: one configuration trained and decoded in a process of its own
(``measure``: training and decoding throughput, peak memory; this file run with a JSON list
of specs is that process), each row's configuration and reference measured back to back in
interleaved rounds (every pair kept in the raw lines as it lands), each row's record (the
ratios over the rounds), and the SAS gates' cost predicted from their multiply-adds.
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eager_training import TORCH_DTYPES, Optimizer, train_step, training_batches
from fairseq_trainer import compiled_graphs  # torch.compile graphs so far (--fused-connections); 0 eager
from rows import SPEED_ROWS, fairseq_argv
from stats import summary

from resnmt.study.records import portable_path

from campaign.files import REPO_ROOT


def read_status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measure(spec):
    """One config, in this (fresh) process: dict of throughput and memory numbers."""
    import torch

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    args, task, batches, dec_batches = measured_batches(spec, cuda)
    mem0 = memory_baseline(cuda)
    torch.manual_seed(1)
    dtype = getattr(torch, TORCH_DTYPES[spec.get("dtype", "fp32")])
    model = task.build_model(args).to(device=device, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())

    def sync():
        if cuda:
            torch.cuda.synchronize()

    train = time_training(model, Optimizer(model, dtype), batches, spec["warmup"], task.target_dictionary.pad(), sync)
    peak = (torch.cuda.max_memory_allocated() if cuda else read_status_kb("VmHWM") * 1024) - mem0
    decode = time_decoding(model, task, dec_batches, spec["decode_len"], sync)
    measured = batches[spec["warmup"]:]
    return {
        "config": spec["config"],
        "train_tokens_per_s": train["tokens"] / train["time"],
        "decode_sentences_per_s": decode["sentences"] / decode["time"],
        # per second of this process's CPU time: on a shared CPU (1 thread) this is the
        # config's own cost, not the share of the cores the scheduler happened to give it
        "train_tokens_per_cpu_s": train["tokens"] / train["cpu"],
        "decode_sentences_per_cpu_s": decode["sentences"] / decode["cpu"],
        "peak_memory_bytes": peak,
        "params": n_params,
        "train_tokens": train["tokens"],
        "train_padded_src_tokens": sum(int(b["net_input"]["src_tokens"].numel()) for b in measured),
        "train_padded_tgt_tokens": sum(int(b["target"].numel()) for b in measured),
        "decode_sentences": decode["sentences"],
        "skipped_updates": train["overflows"],
        # first batches (compilation with --fused-connections): wall seconds, and graphs
        # compiled: none may appear after the warm-ups (one graph serves every batch shape)
        "warmup_train_s": train["warmup_s"],
        "warmup_decode_s": decode["warmup_s"],
        "graphs_after_train_warmup": train["graphs_after_warmup"],
        "graphs_after_decode_warmup": decode["graphs_after_warmup"],
        "graphs_at_end": compiled_graphs(),
    }


def measured_batches(spec, cuda: bool):
    """fairseq's args and task for ``spec``'s config, its training batches (warm-up and
    measured) and its decoding batches, on the GPU when ``cuda``."""
    from fairseq import options, tasks, utils

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, input_args=fairseq_argv(spec["data"], spec["config"], spec["size"], spec["max_tokens"])
    )
    task = tasks.setup_task(args)
    task.load_dataset("train")
    task.load_dataset("valid")
    batches = training_batches(task, spec["max_tokens"], spec["warmup"] + spec["updates"])
    valid = task.dataset("valid")
    n_dec = min(spec["decode_sentences"], len(valid))
    dec_batches = [
        valid.collater([valid[i] for i in range(s, min(s + spec["decode_batch"], n_dec))])
        for s in range(0, n_dec, spec["decode_batch"])
    ]
    if cuda:
        batches = [utils.move_to_cuda(b) for b in batches]
        dec_batches = [utils.move_to_cuda(b) for b in dec_batches]
    return args, task, batches, dec_batches


def memory_baseline(cuda: bool) -> int:
    """The memory in use before the model is built: the GPU's allocated bytes (after a clean
    slate: several configs are measured in one process on a GPU), else the resident set."""
    if not cuda:
        return read_status_kb("VmRSS") * 1024
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def time_training(model, optimizer, batches, warmup: int, pad: int, sync) -> dict:
    """Train on the first ``warmup`` batches, then time the rest: wall and CPU seconds, the
    tokens, the warm-up's seconds and graphs compiled, and the optimizer's overflows."""
    t0 = time.perf_counter()
    for batch in batches[:warmup]:
        train_step(model, optimizer, batch, pad)
    sync()
    warmup_s, graphs_after_warmup = time.perf_counter() - t0, compiled_graphs()
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in batches[warmup:]:
        train_step(model, optimizer, batch, pad)
    sync()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    optimizer.zero_grad()
    return {"time": wall, "cpu": cpu, "tokens": sum(int(b["ntokens"]) for b in batches[warmup:]),
            "warmup_s": warmup_s, "graphs_after_warmup": graphs_after_warmup, "overflows": optimizer.overflows}


def time_decoding(model, task, dec_batches, decode_len: int, sync) -> dict:
    """Beam 4 over ``dec_batches`` after one warm-up batch, every hypothesis ``decode_len``
    tokens long: wall and CPU seconds, the sentences, the warm-up's seconds and graphs."""
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    generator = SequenceGenerator(
        [model], task.target_dictionary, beam_size=4,
        # every hypothesis gets exactly decode_len tokens: an untrained model's output
        # length is arbitrary, and the cost of a step must be compared, not luck
        max_len_a=0, max_len_b=decode_len, min_len=decode_len,
    )
    t0 = time.perf_counter()
    generator.generate([model], dec_batches[0])  # warm-up
    sync()
    warmup_s, graphs_after_warmup = time.perf_counter() - t0, compiled_graphs()
    t0, c0 = time.perf_counter(), time.process_time()
    n_sent = 0
    for batch in dec_batches:
        generator.generate([model], batch)
        n_sent += batch["nsentences"]
    sync()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"time": wall, "cpu": cpu, "sentences": n_sent, "warmup_s": warmup_s,
            "graphs_after_warmup": graphs_after_warmup}


def run_worker(specs, timeout):
    """Measure ``specs`` in order in one fresh process; their results, in order.

    On the CPU each config gets a process of its own (its peak memory is the process's);
    on a GPU one process measures a whole round (peak memory is reset per config), which
    saves a process start, CUDA's initialization and the imports per measurement."""
    cmd = [sys.executable, str(Path(__file__).resolve()), json.dumps(specs)]
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(specs[0]["threads"])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout * len(specs),
                          cwd=str(REPO_ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"measurement of {', '.join(s['config'] for s in specs)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_rounds(rows, base_spec: dict, rounds: int, timeout: int, raw_path: Path, run_id: str,
                   machine: dict, size_name: str) -> dict:
    """{row: [{config: measure's result} per round]}: each row's configuration and reference
    back to back, their order alternated every round (on a GPU a whole round in one process);
    each pair appended to ``raw_path`` as it lands (its data folder portable)."""
    per_row = {r: [] for r in rows}
    started = time.time()
    raw_path.parent.mkdir(parents=True, exist_ok=True)
    cuda = base_spec["device"] == "cuda"
    recorded_spec = dict(base_spec, data=portable_path(base_spec["data"], Path(base_spec["data"]).parent))
    for rnd in range(rounds):
        orders = {row: (SPEED_ROWS[row].reference, SPEED_ROWS[row].config) if rnd % 2 == 0
                  else (SPEED_ROWS[row].config, SPEED_ROWS[row].reference) for row in rows}
        if cuda:  # the whole round in one process
            specs = [dict(base_spec, config=c) for row in rows for c in orders[row]]
            measured = iter(run_worker(specs, timeout))
            round_results = {row: {c: next(measured) for c in orders[row]} for row in rows}
        for row in rows:
            config, ref = SPEED_ROWS[row].config, SPEED_ROWS[row].reference
            order = orders[row]
            if cuda:
                res = round_results[row]
            else:
                res = {c: run_worker([dict(base_spec, config=c)], timeout)[0] for c in order}
            per_row[row].append(res)
            with open(raw_path, "a", encoding="utf-8") as f:  # every pair kept as it lands
                f.write(json.dumps({"benchmark": "speed_raw", "run_id": run_id, "round": rnd + 1, "row": row,
                                    "order": list(order), "results": res, "spec": recorded_spec,
                                    "size_name": size_name, "machine": machine}, ensure_ascii=False) + "\n")
            u = "s" if cuda else "cpu_s"
            print(f"[speed] round {rnd + 1}/{rounds} {row}: "
                  f"train x{res[config]['train_tokens_per_' + u] / res[ref]['train_tokens_per_' + u]:.3f} "
                  f"decode x{res[config]['decode_sentences_per_' + u] / res[ref]['decode_sentences_per_' + u]:.3f} "
                  f"memory x{res[config]['peak_memory_bytes'] / max(res[ref]['peak_memory_bytes'], 1):.3f} "
                  f"({time.time() - started:.0f}s)", file=sys.stderr, flush=True)
    return per_row


def speed_records(per_row: dict, base_spec: dict, size, size_name: str, run_id: str, machine: dict,
                  vocab: int) -> list:
    """A record per row of ``per_row`` (measure_rounds's): each ratio of configuration to
    reference over the rounds (median, min, max; on the CPU per second of process CPU time,
    on a GPU of wall clock), the medians of the absolute numbers, and for SAS rows the
    overhead its gates' multiply-adds predict (``vocab``: the dictionary's size)."""
    # CPU: rates per second of process CPU time (1 thread); GPU: wall clock (synchronized)
    clock = "process CPU time" if base_spec["device"] == "cpu" else "wall clock"
    unit = "cpu_s" if base_spec["device"] == "cpu" else "s"
    results = []
    for row, runs in per_row.items():
        row_spec = SPEED_ROWS[row]
        config, ref, t_train, t_dec, t_mem = (row_spec.config, row_spec.reference, row_spec.train, row_spec.decode,
                                              row_spec.memory)
        ratio = lambda key: summary([r[config][key] / r[ref][key] if r[ref][key] > 0 else None for r in runs])
        rec = {
            "benchmark": "speed", "run_id": run_id, "row": row, "config": config, "reference": ref,
            "size": dict(zip(("layers", "dim", "ffn", "heads"), size), name=size_name),
            "settings": {k: base_spec.get(k, "fp32") for k in ("device", "dtype", "threads", "warmup", "updates",
                                                                "max_tokens", "decode_sentences", "decode_batch",
                                                                "decode_len")},
            "machine": machine, "rounds": len(runs),
            "clock": clock,
            "train_ratio": ratio(f"train_tokens_per_{unit}"),
            "decode_ratio": ratio(f"decode_sentences_per_{unit}"),
            "wall_clock_train_ratio": ratio("train_tokens_per_s"),
            "wall_clock_decode_ratio": ratio("decode_sentences_per_s"),
            "memory_ratio": ratio("peak_memory_bytes"),
            "params_ratio": runs[0][config]["params"] / runs[0][ref]["params"],
            "target_train": t_train, "target_decode": t_dec, "target_memory": t_mem,
            "absolute": {
                c: {k: statistics.median(r[c][k] for r in runs)
                    for k in ("train_tokens_per_s", "decode_sentences_per_s", "train_tokens_per_cpu_s",
                              "decode_sentences_per_cpu_s", "peak_memory_bytes", "params",
                              "warmup_train_s", "warmup_decode_s", "graphs_at_end") if k in runs[0][c]}
                for c in (config, ref)
            },
        }
        if config.startswith("sas"):
            gate_dim = 64 if config.startswith("sas_gate64") else None
            src = sum(r[config]["train_padded_src_tokens"] for r in runs)
            tgt = sum(r[config]["train_padded_tgt_tokens"] for r in runs)
            rec["sas_overhead"] = sas_overhead(size, vocab, gate_dim, src / tgt)
            rec["sas_overhead"]["measured_over_predicted"] = (
                rec["train_ratio"]["median"] / rec["sas_overhead"]["predicted_train_ratio"]
                if rec["train_ratio"]["median"] else None
            )
        results.append(rec)
    return results


def sas_overhead(size, vocab, gate_dim, src_per_tgt=1.0):
    """Analytic per-target-token MACs and parameters of the model and of SAS's gates.

    Per token per sublayer the two gates cost 2*(2h*g + g) MACs (first layer 2h -> g,
    second g -> 1; g = gate hidden size, h in the paper) and hold 2*(2h*g + 2g + 1)
    parameters. The model's own matmuls per token: encoder layer 4h^2 + 2hf (q,k,v,out
    projections, FFN), decoder layer 4h^2 + 2h^2 + 2hf per target token (self-attention,
    cross-attention q/out, FFN) + 2h^2 per source token (cross-attention k/v), output
    projection hV per target token. Attention scores (O(T) per token) are left out.
    """
    layers, h, f, _ = size
    g = gate_dim or h
    enc_tok = layers * (4 * h * h + 2 * h * f)
    dec_tok = layers * (6 * h * h + 2 * h * f) + h * vocab
    model_macs = src_per_tgt * (enc_tok + layers * 2 * h * h) + dec_tok
    gate_tok = 2 * (2 * h * g + g)
    gate_macs = src_per_tgt * layers * 2 * gate_tok + layers * 3 * gate_tok
    gate_params = (2 * layers + 3 * layers) * 2 * (2 * h * g + 2 * g + 1)
    return {
        "gate_dim": g,
        "model_macs_per_tgt_token": model_macs,
        "gate_macs_per_tgt_token": gate_macs,
        "mac_overhead": gate_macs / model_macs,
        "predicted_train_ratio": model_macs / (model_macs + gate_macs),
        "gate_params": gate_params,
    }


def measure_all(specs: list) -> list:
    """``measure`` of each spec in order, in this process (on a GPU after one untimed
    measurement: the process's first training updates select and load the GPU's kernels for
    each batch shape; measured: the first config then ran 7x slower than later ones)."""
    if specs[0]["device"] == "cuda":
        measure(specs[0])
    return [measure(spec) for spec in specs]


if __name__ == "__main__":  # run_worker's process
    print(json.dumps(measure_all(json.loads(sys.argv[1]))))
