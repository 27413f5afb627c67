"""The generation request on the wire: one record (``GenerationRequest``) whose fields are declared once with their
default, rule and tensor in each dialect, one response record (``GenerationResponse``), and a codec per tensor
dialect (``trtllm``: the ``tensorrt_llm`` model; ``llmapi``: the llmapi model; ``text``: ``ensemble`` and
``tensorrt_llm_bls``), inputs and outputs, as numpy arrays; and the OpenAI completion body the kit's frontend sends a
server behind it (``openai_body``). Imports nothing beyond numpy and ``trtllm_kit.errors``,
so a Triton model file can run it without torch.
"""

from trtllm_kit.wire.disagg import DisaggHandle
from trtllm_kit.wire.lora import LoraAdapter
from trtllm_kit.wire.request import GenerationRequest
from trtllm_kit.wire.response import DraftAcceptance, GenerationResponse, Perf, Scored
from trtllm_kit.wire.rules import WireError

__all__ = ["DisaggHandle", "DraftAcceptance", "GenerationRequest", "GenerationResponse", "LoraAdapter", "Perf",
           "Scored", "WireError"]
