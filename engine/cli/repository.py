"""`prune repository`: an exported model into a Triton model repository."""

from __future__ import annotations

from engine.cli.flags import add_openvino, add_setting, non_negative_int, output_folder
from engine.settings import positive_int


def add(new) -> None:
    """`prune repository`'s flags."""
    g = new("repository", help="exported model -> Triton model repository")
    g.add_argument("--model", help="exported model folder (default: the default model)")
    g.add_argument("--out", required=True, help="the model repository folder")
    g.add_argument(
        "--target",
        choices=["cpu", "cpu-openvino", "gpu-onnx", "gpu-tensorrt", "gpu-graph"],
        default="cpu",
        help="cpu: python backend running ONNX Runtime (or OpenVINO: --backend openvino); cpu-openvino: "
        "Triton's openvino backend, gpu-onnx / gpu-tensorrt: Triton's GPU backends (NVIDIA's "
        "container); gpu-graph: the python backend on a GPU running the engine's GPU graph on an fp16 "
        "export (CUDA graphs captured before the model is ready; the engine installed in Triton's python)",
    )
    g.add_argument("--name", help="model name in the repository (default: the folder's name)")
    add_setting(g, "max_batch_size", "; here the largest batch the core model accepts")
    add_setting(g, "max_batch_tokens", "; here the budget the preferred batch sizes are derived from")
    g.add_argument(
        "--max-queue-delay-us",
        type=non_negative_int,
        default=2000,
        help="how long the dynamic batcher waits to fill a batch",
    )
    g.add_argument(
        "--preferred-batch-sizes",
        type=positive_int,
        nargs="+",
        help="dynamic batcher's preferred sizes (default: derived from --max-batch-tokens)",
    )
    g.add_argument("--instances", type=positive_int, default=1, help="model instances")
    add_openvino(g, ("onnxruntime", "openvino"))
    g.add_argument(
        "--intra-op-threads",
        type=non_negative_int,
        help="threads per instance (cpu: ONNX Runtime's or OpenVINO's; cpu-openvino: OpenVINO's)",
    )
    add_setting(g, "ort_arena", "; cpu target")
    add_setting(g, "join_requests")
    g.add_argument(
        "--trt-accelerator",
        action="store_true",
        help="gpu-onnx: ONNX Runtime's TensorRT execution accelerator, fp16",
    )
    g.add_argument("--overwrite", action="store_true", help="replace models of the same name in --out")
    t = g.add_argument_group("text model <name>_text (text in, pruned text out; python backend on CPU)")
    t.add_argument("--no-text-model", action="store_true", help="write only the core model")
    t.add_argument(
        "--text-instances",
        type=positive_int,
        default=4,
        help="text-model instances: text requests served at once (default 4)",
    )
    add_setting(t, "text_max_passages")
    add_setting(t, "text_max_chars")
    g.set_defaults(func=run)


def run(args) -> int:
    """Run `prune repository`; the exit status."""
    from export.triton_repository import RepositoryOptions, build_repository
    from engine.models.default_model import ensure_default_model
    from engine.settings import setting

    output_folder(args.out, "--out")  # bad input is reported before the default model is exported
    is_default = args.model in (None, "default")
    model = str(ensure_default_model(args.log)) if is_default else args.model
    opts = RepositoryOptions(
        target=args.target,
        name=args.name or ("default" if is_default else None),
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        max_queue_delay_us=args.max_queue_delay_us,
        preferred_batch_sizes=args.preferred_batch_sizes,
        instances=args.instances,
        intra_op_threads=args.intra_op_threads or 0,
        trt_accelerator=args.trt_accelerator,
        text_model=not args.no_text_model,
        text_instances=args.text_instances,
        text_max_passages=args.text_max_passages,
        text_max_chars=args.text_max_chars,
        overwrite=args.overwrite,
        ort_arena=args.ort_arena,
        ort_denormals=setting("ort_denormals"),
        join_requests=args.join_requests,
        runtime=args.backend,
        inference_precision=args.inference_precision,
    )
    build_repository(model, args.out, opts, log=args.log)
    return 0
