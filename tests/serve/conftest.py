"""A small build output to serve: manifest, the tiny Llama's tokenizer and a Python-backend ``ensemble``.

The ``ensemble`` here has the kit's text interface (text_input, max_tokens, stream, sampling inputs →
text_output, num_input_tokens) and streams the words `` w0 w1 …`` (`` s{seed}w{i}`` when a seed is given),
one per response; a prompt containing ``short`` ends after 3 words (more with ``min_tokens``, all of
``max_tokens`` with ``end_id`` -1), ``slow`` waits 50 ms per word, ``fail`` is
refused.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.artifact import Artifact, EngineBuild, EngineRecord, ModelRecord, StageRecords
from trtllm_kit.artifact.files import file_hashes
from trtllm_kit.mapping import Mapping
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.tables import BuildOptions

FAKE_MODEL = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self.generate, args=(request, request.get_response_sender()))
            thread.start()
            self.threads.append(thread)
        return None

    def generate(self, request, sender):
        prompt = scalar(request, "text_input").decode()
        if "fail" in prompt:
            error = pb_utils.TritonError("cannot generate: the prompt asks to fail")
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
            return
        num_tokens = int(scalar(request, "max_tokens"))
        if "short" in prompt and scalar(request, "end_id", 0) != -1:  # "EOS" after 3 words, unless ignored
            num_tokens = min(max(3, int(scalar(request, "min_tokens", 0))), num_tokens)
        seed = scalar(request, "seed")
        delay = 0.05 if "slow" in prompt else 0.002
        for i in range(num_tokens):
            if sender.is_cancelled():
                break
            word = f" w{i}" if seed is None else f" s{seed}w{i}"
            outputs = [pb_utils.Tensor("text_output", np.array([[word.encode()]], dtype=np.object_))]
            if scalar(request, "return_num_input_tokens", False):
                outputs.append(pb_utils.Tensor("num_input_tokens", np.array([[len(prompt.split())]], np.int32)))
            sender.send(pb_utils.InferenceResponse(outputs))
            time.sleep(delay)
        sender.send(flags=FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
'''

INPUTS = [("text_input", mc.TYPE_STRING, False), ("max_tokens", mc.TYPE_INT32, False),
          ("stream", mc.TYPE_BOOL, True), ("temperature", mc.TYPE_FP32, True), ("top_p", mc.TYPE_FP32, True),
          ("top_k", mc.TYPE_INT32, True), ("seed", mc.TYPE_UINT64, True),
          ("min_tokens", mc.TYPE_INT32, True), ("end_id", mc.TYPE_INT32, True),
          ("exclude_input_in_output", mc.TYPE_BOOL, True), ("return_num_input_tokens", mc.TYPE_BOOL, True)]


def ensemble_config() -> mc.ModelConfig:
    """The fake ``ensemble``'s config, built as a protobuf message."""
    config = mc.ModelConfig(name="ensemble", backend="python", max_batch_size=8)
    config.model_transaction_policy.decoupled = True
    for name, data_type, optional in INPUTS:
        config.input.add(name=name, data_type=data_type, dims=[1], optional=optional)
    config.output.add(name="text_output", data_type=mc.TYPE_STRING, dims=[-1])
    config.output.add(name="num_input_tokens", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    return config


def make_fake_out(out: Path, *, config_text: str | None = None, engine: EngineBuild | None = None) -> Path:
    """Write a servable build output at ``out`` (``config_text`` replaces the ensemble's config.pbtxt), its
    manifest written by the kit's own ``Artifact`` (target cpu, or engine with ``engine``'s record).

    Arguments:
        out: the directory to create.
        config_text: a replacement config, e.g. a corrupt one.
        engine: what a compile on another machine recorded.
    """
    from trtllm_kit.models.builtin import builtin_dir

    model_dir = out / "repo" / "ensemble"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(FAKE_MODEL)
    (model_dir / "config.pbtxt").write_text(config_text if config_text is not None else
                                            text_format.MessageToString(ensemble_config()))
    (out / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(builtin_dir("tiny-llama") / name, out / "tokenizer" / name)
    from trtllm_kit.artifact.integrity import file_stats

    target = "engine" if engine else "cpu"
    records = StageRecords(model=ModelRecord("builtin:tiny-llama", str(builtin_dir("tiny-llama")), "llama",
                                             "LlamaForCausalLM", 2299136),
                           engine=EngineRecord(target, "stand-in", built=engine),
                           stages=["checkpoint", "engine", "repo"])
    Artifact(path=out, spec=BuildSpec(model="builtin:tiny-llama", out=out, build=BuildOptions(target=target)),
             target=target, layout=Mapping(1, 1), precision=Precision("bfloat16"), records=records,
             files=file_hashes(out), file_stats=file_stats(out)).write()  # serve checks the files against them
    return out


@pytest.fixture
def make_out() -> Callable[..., Path]:
    """``make_fake_out`` for tests that need an output of their own (conftest modules are not importable by
    name: every test directory has one)."""
    return make_fake_out


@pytest.fixture(scope="module")
def fake_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fake_out(tmp_path_factory.mktemp("served") / "out")
