"""What the GPU graph's sessions share (engine/backends/gpu_graph.py): the process's one GPU
thread that runs them (and merges concurrent callers' batches), the one copy of the weights
they are given,"""

from __future__ import annotations

import collections
import concurrent.futures
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.errors import BackendError

#: float initializers of at least this many bytes are shared (smaller ones: scalars, tiny norms)
SHARE_MIN_BYTES = 1024
_FLOAT_TYPES = (1, 10, 16)  # onnx.TensorProto FLOAT, FLOAT16, BFLOAT16


#: seconds without a job before the GPU thread runs its idle tasks (lazy captures)
IDLE_AFTER_S = 0.02


class GpuThread:
    """The one thread that runs every GPU job of the process, in order.

    ONNX Runtime captures CUDA graphs in CUDA's global capture mode ("cuda graph can only work
    with a single thread", onnxruntime/core/providers/cuda/cuda_graph.cc): while one model
    captures, a copy, a synchronize or a session build from another thread fails the capture
    (microsoft/onnxruntime#15002). So every GPU model of a process (a pruner, a compressor beside
    it, a second pruner) hands its work to this one thread (`GpuThread.shared()`): a capture never
    overlaps another model's work.

    - `call(fn, *args)`: fn on the thread, its result (or exception) handed back;
    - `merge(key, rows, limit, fn, payload)`: a job that may be run together with others waiting
      with the same `key` (one model, one padded length): the thread takes the first job waiting
      and every later one of its key while their rows fit `limit`, and runs `fn(payloads)`
      once, which returns each job's result (TEI's queue, infinity's batch handler: concurrent
      callers' batches become one run, none waits on purpose for another);
    - when no job waits, the idle tasks (`add_idle`: a model's lazy captures) run, one step at a
      time, until none has anything to do.
    A job given from the thread itself runs at once."""

    _shared: GpuThread | None = None
    _shared_lock = threading.RLock()  # a release from a finalizer may run inside shared() on this thread

    def __init__(self, name: str = "prune-gpu"):
        self._jobs: collections.deque[_Job] = collections.deque()
        self._ready = threading.Condition()
        self._idle: list[Callable[[], Callable[[], bool] | None]] = []
        self._users = 0
        self._stopping = False
        self._last_job = 0.0
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the process's one thread
    @classmethod
    def shared(cls) -> GpuThread:
        """The process's GPU thread, started by its first user; each user `release`s it once."""
        with cls._shared_lock:
            gpu = cls._shared
            if gpu is None or gpu._stopping or not gpu.thread.is_alive():
                gpu = cls._shared = cls()
            gpu._users += 1
            return gpu

    def release(self) -> None:
        """One user fewer; the last one's release ends the thread (after the jobs given)."""
        with GpuThread._shared_lock:
            self._users -= 1
            last = self._users <= 0
            if last:
                self._stopping = True
                if GpuThread._shared is self:
                    GpuThread._shared = None
        if last:
            self.stop()

    def add_idle(self, task: Callable[[], bool]) -> None:
        """Run `task` when no job waits (it returns whether it did something); a bound method
        is held weakly: the thread does not keep its owner alive."""
        ref = weakref.WeakMethod(task) if hasattr(task, "__self__") else (lambda: task)
        with self._ready:
            self._idle.append(ref)
            self._ready.notify()

    def remove_idle(self, owner: Any) -> None:
        """Drop the idle tasks bound to `owner` (and those whose owner is gone)."""
        with self._ready:
            self._idle = [
                r for r in self._idle if (t := r()) is not None and getattr(t, "__self__", None) is not owner
            ]

    # ------------------------------------------------------------------ jobs
    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the thread; its result, or its exception raised here."""
        if threading.current_thread() is self.thread:
            return fn(*args)
        return self._put(_Job(fn, args)).result()

    def merge(
        self, key: Any, rows: int, limit: int, fn: Callable[[list[Any]], list[Any]], payload: Any
    ) -> Any:
        """`payload`'s result of `fn([payload, ...])`, run together with the other jobs of `key`
        waiting when it is taken, while their rows stay within `limit`."""
        if threading.current_thread() is self.thread:
            return fn([payload])[0]
        return self._put(_Job(fn, (payload,), key, rows, limit)).result()

    def _put(self, job: _Job) -> concurrent.futures.Future:
        with self._ready:
            if self._stopping and job.fn is not None or not self.thread.is_alive():
                raise BackendError("the GPU thread has stopped (the backend was closed)")
            self._jobs.append(job)
            self._ready.notify()
        return job.done

    def _next(self) -> _Job:
        """The next job, running the idle tasks while none waits: not before IDLE_AFTER_S
        without a job (a call's next batch, or the next call, is not kept waiting behind a
        capture it would have preceded)."""
        while True:
            with self._ready:
                if self._jobs:
                    return self._jobs.popleft()
                quiet = time.monotonic() - self._last_job
                if not self._idle or quiet < IDLE_AFTER_S:
                    self._ready.wait(None if not self._idle else IDLE_AFTER_S - quiet)
                    continue
            if not self._idle_round():
                with self._ready:
                    if not self._jobs:
                        self._ready.wait()

    def _idle_round(self) -> bool:
        """One step of each idle task whose owner lives; whether one did something. (Its owners
        are held only while it runs: a model dropped meanwhile is let go.)"""
        with self._ready:
            self._idle = [r for r in self._idle if r() is not None]
            refs = list(self._idle)
        did = False
        for ref in refs:
            task = ref()
            if task is not None:
                did = self._idle_step(task) or did
            del task
        return did

    @staticmethod
    def _idle_step(task: Callable[[], bool]) -> bool:
        try:
            return bool(task())
        except Exception:  # an idle task never stops the thread; the task reports its own errors
            return False

    def _group(self, job: _Job) -> list[_Job]:
        """`job` and the jobs waiting with its key whose rows still fit its limit, in order."""
        group, rows = [job], job.rows
        with self._ready:
            for other in list(self._jobs):
                if other.key == job.key and rows + other.rows <= job.limit:
                    group.append(other)
                    rows += other.rows
            for other in group[1:]:
                self._jobs.remove(other)
        return group

    def _loop(self) -> None:
        while True:
            job = self._next()
            if job.fn is None:
                return
            self._run(job)
            del job  # the loop holds no job (nor its owner) between jobs
            self._last_job = time.monotonic()

    def _run(self, job: _Job) -> None:
        """`job`, or the run of its merged group; every caller gets its result or the exception."""
        live: list[_Job] = []
        try:
            group = self._group(job) if job.key is not None else [job]
            live = [j for j in group if j.done.set_running_or_notify_cancel()]
            if not live:
                return
            if job.key is None:
                results = [job.fn(*job.args)]
            else:
                results = job.fn([j.args[0] for j in live])
        except BaseException as exc:  # handed to every caller of the run; the thread goes on
            for j in live or [job]:
                if not j.done.done():
                    j.done.set_exception(exc)
        else:
            for j, result in zip(live, results):
                j.done.set_result(result)

    def stop(self) -> None:
        """End the thread after the jobs already given."""
        with self._ready:
            self._stopping = True
            if self.thread.is_alive():
                self._jobs.append(_Job(None, ()))
                self._ready.notify()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()


@dataclass(eq=False)  # compared by identity: the queue removes the very job (its arrays have no ==)
class _Job:
    """A job of the GPU thread: fn(*args) (fn None: stop), or a mergeable one (`key` set)."""

    fn: Callable[..., Any] | None
    args: tuple
    key: Any = None
    rows: int = 0
    limit: int = 0
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class BoundSession:
    """One session and how it is run: a captured shape (`rows` x `length`, its inputs and
    outputs bound once on the device), or the dynamic one (rows None: bound per batch). Its
    outputs are the graph's, in its order: [rows] or [rows, length] by their rank."""

    def __init__(
        self, ort: Any, session: Any, device: str, rows: int | None, length: int | None, device_id: int = 0
    ):
        self.session, self.rows, self.length = session, rows, length
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        ranks = [len(o.shape) for o in session.get_outputs()]
        self.binding = session.io_binding()
        self.runs = 0
        self.inputs: dict[str, Any] = {}
        self.outputs: list[Any] = []
        if rows is None:
            return
        where = ("cuda", device_id) if device == "cuda" else ("cpu", 0)
        self.inputs = {
            n: ort.OrtValue.ortvalue_from_shape_and_type([rows, length], np.int64, *where)
            for n in self.input_names
        }
        self.outputs = [
            ort.OrtValue.ortvalue_from_shape_and_type([rows, length][:rank], np.float32, *where)
            for rank in ranks
        ]
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        for name, value in zip(self.output_names, self.outputs):
            self.binding.bind_ortvalue_output(name, value)

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The batch `feeds` (int64, this shape's) through the session; its outputs."""
        self.runs += 1
        if self.rows is None:
            self.binding.clear_binding_inputs()
            self.binding.clear_binding_outputs()
            for name in self.input_names:
                self.binding.bind_cpu_input(name, feeds[name])
            for name in self.output_names:
                self.binding.bind_output(name, "cpu")
            self.session.run_with_iobinding(self.binding)
            return tuple(self.binding.copy_outputs_to_cpu())
        for name, value in self.inputs.items():
            value.update_inplace(feeds[name])
        self.binding.synchronize_inputs()  # the copies are done before the graph reads them
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()
        # copies, made here: on the CPU provider numpy() may be a view of the bound buffer, which
        # the next batch overwrites while the caller still reads it
        return tuple(np.array(value.numpy(), copy=True) for value in self.outputs)


def _device_value(ort: Any, array: np.ndarray, device: str, device_id: int = 0) -> tuple[Any, Any]:
    """(an OrtValue ONNX Runtime will share, what keeps its memory): `array` copied to the
    device once, then seen through DLPack as a tensor whose buffer its OrtValue does not own,
    which is what `add_initializer` takes (it refuses an owning one)."""
    from onnxruntime.capi import _pybind_state as C

    owner = ort.OrtValue.ortvalue_from_numpy(
        array, *(("cuda", device_id) if device == "cuda" else ("cpu", 0))
    )
    capsule = owner._ortvalue.to_dlpack()
    try:
        view = C.OrtValue.from_dlpack(capsule, False)  # (data, is_bool_tensor): 1.21-1.31's GPU wheels
    except TypeError:
        view = C.OrtValue.from_dlpack(capsule)  # (data): the CPU wheel of 1.32
    # on the CPU provider the owner is the array's own buffer; on the GPU a copy: the host array may go
    return ort.OrtValue(view), owner


class SharedWeights:
    """The graph's float initializers of SHARE_MIN_BYTES or more, on `device` once
    (`values`: name -> OrtValue, for `add_initializer`), and `graph`: a copy of the graph,
    in a temporary folder, whose tensors of that size are external data in one file beside
    it (read by ONNX Runtime only for a tensor it is not given)."""

    def __init__(
        self, ort: Any, graph: Path, device: str, min_bytes: int = SHARE_MIN_BYTES, device_id: int = 0
    ):
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
            value, keep = _device_value(ort, array, device, device_id)
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
