"""What the GPU graph's sessions share (engine/backends/gpu_graph.py): the one thread that
runs them, and the one copy of the weights they are given."""

from __future__ import annotations

import concurrent.futures
import queue
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.errors import BackendError

#: float initializers of at least this many bytes are shared (smaller ones: scalars, tiny norms)
SHARE_MIN_BYTES = 1024
_FLOAT_TYPES = (1, 10, 16)  # onnx.TensorProto FLOAT, FLOAT16, BFLOAT16


class GpuThread:
    """One thread that runs every job given to it, in order (`call`), and, when no job is
    waiting, `idle()` (which returns whether it did something; it is called again until it
    says no). A job given from the thread itself runs at once."""

    def __init__(self, name: str = "prune-gpu", idle: Callable[[], bool] | None = None):
        self.jobs: queue.Queue = queue.Queue()
        # a bound method is held weakly: the thread does not keep its owner alive
        self._idle_ref = weakref.WeakMethod(idle) if hasattr(idle, "__self__") else (lambda: idle)
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the thread; its result, or its exception raised here."""
        if threading.current_thread() is self.thread:
            return fn(*args)
        if not self.thread.is_alive():
            raise BackendError("the GPU thread has stopped (the backend was closed)")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((fn, args, done))
        return done.result()

    def _loop(self) -> None:
        busy = True
        while True:
            try:
                job = self.jobs.get(timeout=0.02 if busy else None)
            except queue.Empty:
                busy = self._idle()
                continue
            if job is None:
                return
            fn, args, done = job
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(*args))
                except BaseException as exc:  # handed to the caller
                    done.set_exception(exc)
            del job, fn, args, done  # the loop holds no job (nor its owner) between jobs
            busy = True

    @property
    def idle(self) -> Callable[[], bool]:
        """What the thread does when no job waits (it returns whether it did something)."""
        return self._idle_ref() or (lambda: False)

    @idle.setter
    def idle(self, fn: Callable[[], bool]) -> None:
        self._idle_ref = lambda: fn

    def _idle(self) -> bool:
        try:
            return bool(self.idle())
        except Exception:  # an idle task never stops the thread; the task reports its own errors
            return False

    def stop(self) -> None:
        """End the thread after the jobs already given."""
        if self.thread.is_alive():
            self.jobs.put(None)
            if threading.current_thread() is not self.thread:
                self.thread.join()


def _device_value(ort: Any, array: np.ndarray, device: str) -> tuple[Any, Any]:
    """(an OrtValue ONNX Runtime will share, what keeps its memory): `array` copied to the
    device once, then seen through DLPack as a tensor whose buffer its OrtValue does not own,
    which is what `add_initializer` takes (it refuses an owning one)."""
    from onnxruntime.capi import _pybind_state as C

    owner = ort.OrtValue.ortvalue_from_numpy(array, "cuda" if device == "cuda" else "cpu", 0)
    capsule = owner._ortvalue.to_dlpack()
    try:
        view = C.OrtValue.from_dlpack(capsule, False)  # onnxruntime 1.32: (data, is_bool_tensor)
    except TypeError:
        view = C.OrtValue.from_dlpack(capsule)  # 1.31 and earlier: (data)
    return ort.OrtValue(view), (owner, array)


class SharedWeights:
    """The graph's float initializers of SHARE_MIN_BYTES or more, on `device` once
    (`values`: name -> OrtValue, for `add_initializer`), and `graph`: a copy of the graph,
    in a temporary folder, whose tensors of that size are external data in one file beside
    it (read by ONNX Runtime only for a tensor it is not given)."""

    def __init__(self, ort: Any, graph: Path, device: str, min_bytes: int = SHARE_MIN_BYTES):
        import onnx
        from onnx import numpy_helper

        proto = onnx.load(str(graph))
        self.values: dict[str, Any] = {}
        self.sizes: dict[str, int] = {}  # name -> bytes
        self._keep: list[Any] = []
        self.bytes = 0
        for tensor in proto.graph.initializer:
            if tensor.data_type not in _FLOAT_TYPES:
                continue
            array = numpy_helper.to_array(tensor)
            if array.nbytes < min_bytes:
                continue
            value, keep = _device_value(ort, array, device)
            self.values[tensor.name] = value
            self.sizes[tensor.name] = array.nbytes
            self._keep.append(keep)
            self.bytes += array.nbytes
        self.folder = Path(tempfile.mkdtemp(prefix="prune-gpu-graph-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        self.graph = self.folder / "model.onnx"
        onnx.save_model(
            proto,
            str(self.graph),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="weights.bin",
            size_threshold=min_bytes,
        )

    def add_to(self, opts: Any) -> None:
        """Give every shared weight to a session's options."""
        for name, value in self.values.items():
            opts.add_initializer(name, value)

    def close(self) -> None:
        """Drop the device copies and the folder."""
        self.values.clear()
        self._keep.clear()
        self._cleanup()
