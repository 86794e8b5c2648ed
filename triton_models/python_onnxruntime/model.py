"""Triton python-backend model: runs the exported ONNX graph with ONNX Runtime on CPU.

Copied by `prune repository --target cpu` into `<model>/1/model.py`, beside
`model.onnx`. The dynamic batcher hands `execute()` a list of requests (each [b, L]
with its own L): they are joined into one batch padded to the longest L, run once, and
the outputs are split back, one response per request, each request's sentence axis
cut to its own S. A request that is malformed gets its own error response; the others
still run.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

PAD = {"input_ids": None, "attention_mask": 0, "token_type_ids": 0, "sentence_ids": -1}


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort
        self.config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in self.config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        opts = ort.SessionOptions()
        threads = int(params.get("intra_op_threads", "0") or 0)
        if threads:
            opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(os.path.join(folder, "model.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        PAD["input_ids"] = int(params.get("pad_id", "0"))
        self.out_dtypes = {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"])
                           for o in self.config["output"]}

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
        return arrays

    def execute(self, requests):
        responses = [None] * len(requests)
        parsed = []
        for i, request in enumerate(requests):
            try:
                parsed.append((i, self._read(request)))
            except Exception as exc:  # this request only
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if parsed:
            rows = sum(a["input_ids"].shape[0] for _, a in parsed)
            length = max(a["input_ids"].shape[1] for _, a in parsed)
            batch = {n: np.full((rows, length), PAD[n], dtype=np.int64) for n in self.input_names}
            spans, pos = [], 0
            for i, arrays in parsed:
                b, l = arrays["input_ids"].shape
                for n in self.input_names:
                    batch[n][pos:pos + b, :l] = arrays[n]
                spans.append((i, pos, b, int(arrays["sentence_ids"].max(initial=-1)) + 1))
                pos += b
            try:
                rerank, probs = self.session.run(["rerank_score", "sentence_probs"], batch)
            except Exception as exc:
                for i, _, _, _ in spans:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {exc}"))
                return responses
            for i, start, b, n_sent in spans:
                out = [pb_utils.Tensor("rerank_score",
                                       rerank[start:start + b].astype(self.out_dtypes["rerank_score"])),
                       pb_utils.Tensor("sentence_probs", np.ascontiguousarray(
                           probs[start:start + b, :n_sent]).astype(self.out_dtypes["sentence_probs"]))]
                responses[i] = pb_utils.InferenceResponse(output_tensors=out)
        return responses

    def finalize(self):
        self.session = None
