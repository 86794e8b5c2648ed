"""Triton python-backend model: the CPU core, running the exported graph with ONNX
Runtime or, where `prune repository --backend openvino` asked for it (or the export is
an OpenVINO IR), with OpenVINO; and, for `--target gpu-graph`, the GPU core running the fp16
export's GPU graph on the engine's own backend (`_GpuGraph`).

Copied by `prune repository --target cpu` into `<model>/1/model.py`, beside the graph
(`model.onnx`, or `model.xml` + `model.bin`). The dynamic batcher hands `execute()` a
list of requests (each [b, L] with its own L): they are joined into one batch padded to
the longest L, run once, and the outputs are split back, one response per request, each
request's sentence axis cut to its own S. With the parameter `join_requests` false
(`prune repository`'s default for ONNX Runtime's dynamic INT8 graphs) each request runs
alone, so its answer is the same whatever the batcher grouped it with.

Every request is checked on its own before anything is allocated for it: int64 [b, L]
inputs of one shape, L within the model's window, token ids within the vocabulary,
attention mask and token types 0/1, sentence ids within [-1, L). A malformed request
gets its own error response; the others still run. If the joint run fails anyway, each
request is run alone, so only the one that fails gets the error.

An LLMLingua-2 export's core (`prune repository` on a compressor export) is the same model
with one output, `token_probs` [b, L] (input_ids and attention_mask in): each request gets its
own rows cut to its own L.

This file runs inside Triton without the engine installed (but for the gpu-graph runtime, which
is the engine's): the runtimes' settings are read from the config's parameters (written by
export/triton_repository.py).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

PAD = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "sentence_ids": -1}


def _written(params, name):
    """A parameter `prune repository` writes (its defaults are the engine's settings, not
    repeated here); a clear error when a hand-written config lacks it."""
    if name not in params:
        raise ValueError(
            f"config.pbtxt lacks the parameter {name!r}: write the repository with prune repository"
        )
    return params[name]


class _OnnxRuntime:
    """The graph on ONNX Runtime's CPU provider, its arena as the parameters say."""

    name = "onnxruntime"

    def __init__(self, path, params, output_names):
        import onnxruntime as ort

        self.output_names = output_names

        opts = ort.SessionOptions()
        threads = int(params.get("intra_op_threads", "0") or 0)
        if threads:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        # denormal floats flushed to zero or kept (the setting ort_denormals, which prune repository
        # writes; masked attention makes them, and on Intel CPUs each costs a microcode assist). This
        # process's first session: ORT flushes the thread that makes it and its own pool's
        flush = _written(params, "ort_denormals") == "flush"
        opts.add_session_config_entry("session.set_denormal_as_zero", "1" if flush else "0")
        # memory a large batch took goes back after it (the setting ort_arena, which prune repository
        # writes; a server keeps running, so "keep" would hold its peak for good)
        arena = _written(params, "ort_arena")
        if arena == "off":
            opts.enable_cpu_mem_arena = False
        # ... after a run of more than ort_shrink_above_tokens padded tokens only: smaller
        # runs keep the arena they grew (shrinking after each of them costs speed)
        self.plain_run = ort.RunOptions()
        self.shrink_run = None
        self.shrink_above = int(params.get("ort_shrink_above_tokens", "0") or 0)
        if arena == "shrink":
            self.shrink_run = ort.RunOptions()
            self.shrink_run.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, batch, tokens):
        run = (
            self.shrink_run if self.shrink_run is not None and tokens > self.shrink_above else self.plain_run
        )
        return self.session.run(self.output_names, batch, run)


class _OpenVino:
    """The graph (ONNX or IR) on OpenVINO's CPU plugin: one stream, the latency hint, the
    inference precision (f32, or bf16 where the CPU computes it natively) and threads as
    the parameters say (engine/backends/openvino.py is the in-process counterpart)."""

    name = "openvino"

    def __init__(self, path, params, output_names):
        import openvino as ov

        self.output_names = output_names

        core = ov.Core()
        precision = params.get("inference_precision", "f32")
        if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            raise RuntimeError(
                "inference_precision bf16: this CPU does not compute in bf16 natively "
                "(AVX512_BF16 or AMX-BF16); write the repository with fp32"
            )
        config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        threads = int(params.get("intra_op_threads", "0") or 0)
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(core.read_model(path), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.outputs = [self.compiled.output(n) for n in output_names]  # looked up once

    def run(self, batch, tokens):
        out = self.request.infer(batch)
        return [np.array(out[port], copy=True) for port in self.outputs]


class _GpuGraph:
    """The fp16 export's GPU graph on the engine's GpuGraphBackend (`prune repository --target
    gpu-graph`): one copy of the weights, and every shape the batches take captured as a CUDA graph
    here, in initialize(), smallest first, within PRUNE_GPU_GRAPHS and PRUNE_GPU_MEMORY (the
    engine's settings, read from this process's environment): Triton calls the model ready only once
    they are, so no request waits for a capture. The requests the dynamic batcher joins are padded to
    the graph's next length and run in chunks of the shape's rows. Unlike the other runtimes this one
    needs the engine in Triton's python environment (the text model beside it does too)."""

    name = "gpu_graph"

    def __init__(self, path, params, output_names):
        from engine.backends.gpu_graph import GpuGraphBackend
        from engine.models.loading import gpu_graph_settings
        from engine.pipeline.encode import BatchingConfig

        self.output_names = output_names
        manifest = json.loads(params.get("prune_manifest", "{}"))
        lengths = manifest.get("buckets") or [int(manifest.get("max_length", 512))]
        budget = BatchingConfig(
            max_batch_tokens=int(_written(params, "max_batch_tokens")),
            max_batch_size=int(_written(params, "gpu_max_batch_size")),
        )
        settings = {**gpu_graph_settings(), "merge": False}  # Triton's dynamic batcher joins the requests
        self.core = GpuGraphBackend(
            path,
            lengths,
            device=params.get("device", "cuda"),
            device_id=int(params.get("instance_device_id", "0") or 0),  # this instance's GPU (KIND_GPU)
            batching=budget,
            outputs=tuple(output_names),
            log=lambda m: print(m, flush=True),  # Triton's log (the stub's stdout is a pipe)
            **settings,
        )
        self.input_names = list(self.core.input_names)
        self.pad = {**PAD, "input_ids": int(params.get("pad_id", "0"))}

    def run(self, batch, tokens):
        rows, length = batch["input_ids"].shape
        padded = next((n for n in self.core.lengths if n >= length), None)
        if padded is None:
            raise ValueError(f"length {length} is past the graph's longest, {self.core.lengths[-1]}")
        if padded > length:
            batch = {
                n: np.pad(a, ((0, 0), (0, padded - length)), constant_values=self.pad[n])
                for n, a in batch.items()
            }
        step = self.core.rows_for(padded)[-1]
        parts = [
            self.core.run({n: a[at : at + step] for n, a in batch.items()}) for at in range(0, rows, step)
        ]
        out = [np.concatenate([p[k] for p in parts]) for k in range(len(self.output_names))]
        return [o if o.ndim == 1 else o[:, :length] for o in out]

    def close(self):
        self.core.close()


RUNTIMES = {"onnxruntime": _OnnxRuntime, "openvino": _OpenVino, "gpu_graph": _GpuGraph}


class TritonPythonModel:
    """The core model on CPU: token ids in, scores out, in Triton's python backend."""

    def initialize(self, args):
        """Open the runtime from the model's folder and config."""
        self.config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in self.config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        runtime = params.get("runtime", "onnxruntime")
        if runtime not in RUNTIMES:
            raise ValueError(f"parameter runtime must be one of {sorted(RUNTIMES)}, got {runtime!r}")
        # what the config declares: rerank_score and sentence_probs, or a compressor's token_probs
        outputs = [o["name"] for o in self.config["output"]]
        graph = os.path.join(folder, params.get("graph", "model.onnx"))
        params["instance_device_id"] = args.get("model_instance_device_id", "0")  # Triton's, per instance
        self.runtime = RUNTIMES[runtime](graph, params, outputs)
        self.input_names = self.runtime.input_names
        # false: each request of a dynamic batch runs alone, so its answer never depends on
        # the requests beside it (INT8 scales are taken per batch; export/triton_repository.py)
        self.join = params.get("join_requests", "true") == "true"
        self.pad = {**PAD, "input_ids": int(params.get("pad_id", "0"))}
        # read raw: this core model runs in Triton without the engine installed (engine.pipeline.spec.Manifest)
        manifest = json.loads(params.get("prune_manifest", "{}"))
        # Bounds a request must respect (graph-independent: checked before allocation).
        self.max_length = int(manifest.get("max_length", 512))
        self.vocab_size = (
            int(manifest.get("embedding_rows") or manifest.get("tokenizer", {}).get("vocab_size", 0)) or None
        )
        self.out_dtypes = {
            o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in self.config["output"]
        }

    def _read(self, request):
        arrays = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"missing input {name}")
            arr = tensor.as_numpy()
            if arr.ndim != 2 or arr.dtype != np.int64:
                raise ValueError(f"{name} must be int64 [batch, length], got {arr.dtype} {arr.shape}")
            arrays[name] = arr
        shapes = {a.shape for a in arrays.values()}
        if len(shapes) != 1:
            raise ValueError(f"inputs disagree in shape: {sorted(shapes)}")
        rows, length = arrays["input_ids"].shape
        if rows < 1 or length < 1:
            raise ValueError(f"empty input of shape {[rows, length]}")
        if length > self.max_length:
            raise ValueError(
                f"sequence length {length} exceeds the model's window of {self.max_length} tokens"
            )
        ids = arrays["input_ids"]
        if ids.min() < 0 or (self.vocab_size and ids.max() >= self.vocab_size):
            raise ValueError(
                f"input_ids must be within [0, {self.vocab_size}), got [{ids.min()}, {ids.max()}]"
            )
        for name in ("attention_mask", "token_type_ids"):
            if name in arrays and (arrays[name].min() < 0 or arrays[name].max() > 1):
                raise ValueError(f"{name} must be 0 or 1")
        sent = arrays.get("sentence_ids")  # a compressor's core has none
        if sent is not None and (sent.min() < -1 or sent.max() >= length):
            raise ValueError(f"sentence_ids must be within [-1, {length}), got [{sent.min()}, {sent.max()}]")
        return arrays

    def execute(self, requests):
        """Run the requests (joined into one batch, or alone for INT8)."""
        responses = [None] * len(requests)
        parsed = []
        for i, request in enumerate(requests):
            try:
                parsed.append((i, self._read(request)))
            except Exception as exc:  # this request only
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if parsed:
            done = None
            if self.join:
                try:
                    done = self._run(parsed)
                except Exception:  # isolate: each request alone, so only a failing one errs
                    done = None
            if done is None:
                done = []
                for item in parsed:
                    try:
                        done += self._run([item])
                    except Exception as exc:
                        done.append(
                            (
                                item[0],
                                pb_utils.InferenceResponse(
                                    error=pb_utils.TritonError(f"{self.runtime.name}: {exc}")
                                ),
                            )
                        )
            for i, response in done:
                responses[i] = response
        return responses

    def _run(self, parsed):
        """One run for the requests `parsed` ([(index, arrays)]), padded to the
        longest; returns [(index, response)]."""
        rows = sum(a["input_ids"].shape[0] for _, a in parsed)
        length = max(a["input_ids"].shape[1] for _, a in parsed)
        batch = {n: np.full((rows, length), self.pad[n], dtype=np.int64) for n in self.input_names}
        spans, pos = [], 0
        for i, arrays in parsed:
            b, width = arrays["input_ids"].shape
            for n in self.input_names:
                batch[n][pos : pos + b, :width] = arrays[n]
            # the second axis of each request's answer: its sentences, or (a compressor) its tokens
            sent = arrays.get("sentence_ids")
            spans.append((i, pos, b, width if sent is None else int(sent.max(initial=-1)) + 1))
            pos += b
        results = dict(zip(self.runtime.output_names, self.runtime.run(batch, rows * length)))
        out = []
        for i, start, b, width in spans:
            tensors = []
            for name, value in results.items():
                mine = value[start : start + b] if value.ndim == 1 else value[start : start + b, :width]
                tensors.append(
                    pb_utils.Tensor(name, np.ascontiguousarray(mine).astype(self.out_dtypes[name]))
                )
            out.append((i, pb_utils.InferenceResponse(output_tensors=tensors)))
        return out

    def finalize(self):
        """Release the runtime (the GPU graph's sessions and weights on the device)."""
        close = getattr(self.runtime, "close", None)
        if close is not None:
            close()
        self.runtime = None
