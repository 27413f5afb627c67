"""The model run one decoder layer at a time, as llm-compressor's sequential pipeline and AutoAWQ do: the embedding
runs once over the calibration windows; then each decoder layer is built, its weights read from the safetensors
files (``pread`` of their byte ranges, nothing else of the file is touched), run over every window, and freed; its
outputs are the next layer's inputs. Memory follows one layer's weights in the compute dtype plus the windows'
hidden states, never the model, so one GPU or a plain CPU box calibrates a model of any size.

A layer of the kit's families is ``decoder_layer.py``'s math; any other config runs ``transformers``' own class
for its family (``Layer`` is either, with the same calls).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from trtllm_kit.errors import CheckpointError
from trtllm_kit.models.inspect import ModelSpec, TensorInfo
from trtllm_kit.quant.decoder_layer import DecoderLayer, LinearHook, rotary_tables, unsupported

EMBEDDING = "model.embed_tokens.weight"
LAYER_PREFIX = "model.layers.{}."
EMBEDDING_CHUNK_BYTES = 16 << 20  # the embedding table is read this many bytes of rows at a time


def read_tensor(name: str, info: TensorInfo, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """One tensor (or its rows ``[start, stop)``) read from its file into a fresh CPU tensor.

    A safetensors tensor is read with ``pread`` at its offset, so only its bytes are paged in and no mapping of
    the whole file exists (a 5 GB shard costs the process nothing but the tensor); a pickle checkpoint is
    memory-mapped by ``torch.load``.

    Arguments:
        name: the tensor's name; info: where it lives; rows: a row range, or None for all of it.
    """
    first, last = rows or (0, info.shape[0] if info.shape else 1)
    if info.offset is None:
        state = torch.load(info.path, map_location="cpu", mmap=True, weights_only=True)
        return state[name][first:last].clone() if info.shape else state[name].clone()
    shape = (last - first, *info.shape[1:]) if info.shape else ()
    out = torch.empty(shape, dtype=info.dtype)
    row_bytes = info.nbytes // info.shape[0] if info.shape else info.nbytes
    view = out.reshape(-1).view(torch.uint8).numpy().data.cast("B")
    fd = os.open(info.path, os.O_RDONLY)
    try:
        done, start = 0, info.offset + first * row_bytes
        while done < len(view):
            got = os.preadv(fd, [view[done:]], start + done)
            if got == 0:
                raise CheckpointError(f"{info.path.name} ended {len(view) - done} bytes early; the file changed "
                                      "or is truncated: download or copy it again.")
            done += got
    finally:
        os.close(fd)
    return out


@dataclass
class Layer:
    """A decoder layer ready to run.

    Arguments:
        linears: each linear's ``(weight, bias)`` by name relative to the layer (``self_attn.q_proj``, ...);
        forward: ``(hidden, on_linear) -> hidden`` over [windows, tokens, hidden], ``on_linear`` called with every
        linear's name, input and output.
    """

    linears: dict[str, tuple[torch.Tensor, torch.Tensor | None]]
    forward: Callable[[torch.Tensor, LinearHook], torch.Tensor]


@dataclass
class LayerStream:
    """Builds the model's pieces one at a time on ``device`` in ``dtype``.

    Arguments:
        model: the inspected HF model; dtype: the compute dtype; device: a torch device.
    """

    model: ModelSpec
    dtype: torch.dtype
    device: str
    _hf_classes: Any = field(init=False, default=None, repr=False)  # transformers' (config, layer, rotary)
    _rotary: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False, repr=False)
    _masks: dict[tuple[int, int | None], torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if unsupported(self.model.hf) is None:
            return
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(self.model.path), trust_remote_code=False)
        config._attn_implementation = "eager"  # the explicit mask below; sdpa would pick its own kernel
        with torch.device("meta"):  # the classes the family's model is made of; no weights exist
            skeleton = AutoModelForCausalLM.from_config(config)
        rotary = type(skeleton.model.rotary_emb)(config=config).to(self.device)
        self._hf_classes = (config, type(skeleton.model.layers[0]), rotary)

    @property
    def num_layers(self) -> int:
        return self.model.hf.num_hidden_layers

    @property
    def runs_transformers(self) -> bool:
        """Whether the layers are transformers' classes (a config ``decoder_layer.py`` does not compute)."""
        return self._hf_classes is not None

    def embed(self, windows: list[list[int]]) -> torch.Tensor:
        """The embedding of each window's tokens ([windows, tokens, hidden], all windows of one length), its
        table read a chunk of rows at a time.

        Arguments:
            windows: token-id lists of one length.
        """
        info = self.model.tensors[EMBEDDING]
        ids = torch.tensor(windows, dtype=torch.int64)
        out = torch.empty((*ids.shape, info.shape[1]), dtype=self.dtype)
        per_chunk = max(1, EMBEDDING_CHUNK_BYTES // (info.nbytes // info.shape[0]))
        for start in range(0, info.shape[0], per_chunk):
            stop = min(info.shape[0], start + per_chunk)
            here = (ids >= start) & (ids < stop)
            if bool(here.any()):
                rows = read_tensor(EMBEDDING, info, (start, stop))
                out[here] = rows[ids[here] - start].to(self.dtype)
        return out.to(self.device)

    def layer_weights(self, index: int) -> dict[str, torch.Tensor]:
        """The layer's tensors as stored (names relative to the layer), read from their files.

        Arguments:
            index: the decoder layer.
        """
        prefix = LAYER_PREFIX.format(index)
        ignored = {pattern.format(index) for pattern in self.model.family.ignored}
        return {name.removeprefix(prefix): read_tensor(name, info) for name, info in self.model.tensors.items()
                if name.startswith(prefix) and name not in ignored}

    def build_layer(self, index: int, weights: dict[str, torch.Tensor]) -> Layer:
        """Decoder layer ``index`` holding ``weights`` in the compute dtype, on the device.

        Arguments:
            index: the decoder layer; weights: from ``layer_weights``.
        """
        state = {name: t.to(self.device, self.dtype) for name, t in weights.items()}
        if self._hf_classes is None:
            self._check_layer(index, state)
            layer, window = DecoderLayer(self.model.hf, state), self.model.hf.sliding_window

            def forward(hidden: torch.Tensor, on_linear: LinearHook) -> torch.Tensor:
                tokens = hidden.shape[1]
                return layer(hidden, self._rotary_tables(tokens), self._mask(tokens, window), on_linear)

            return Layer(layer.linears, forward)
        return self._transformers_layer(index, state)

    def _check_layer(self, index: int, state: dict[str, torch.Tensor]) -> None:
        """Every weight the family's layer has, and nothing of another shape or name (as a strict load checks)."""
        slot = LAYER_PREFIX.format("{}")
        expected = {name.removeprefix(slot): shape for name, shape in self.model.family.hf_shapes(self.model.hf).items()
                    if name.startswith(slot)}
        wrong = [f"{name} {tuple(t.shape)}" for name, t in state.items() if expected.get(name) != tuple(t.shape)]
        missing = [f"no {name}" for name in expected if name.endswith(".weight") and name not in state]
        if wrong or missing:
            raise CheckpointError(f"layer {index} of {self.model.path} does not match its config.json "
                                  f"({', '.join(sorted(missing + wrong))}); the checkpoint is incomplete or of "
                                  "another model.")

    def _transformers_layer(self, index: int, state: dict[str, torch.Tensor]) -> Layer:
        config, layer_class, rotary = self._hf_classes
        with torch.device("meta"):
            module = layer_class(config, index)
        try:
            module.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as exc:
            raise CheckpointError(f"layer {index} of {self.model.path} does not match its config.json "
                                  f"({str(exc).splitlines()[0]}); the checkpoint is incomplete or of another "
                                  "model.") from None
        module.eval()
        linears = {sub: m for sub, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
        window = getattr(module.self_attn, "sliding_window", getattr(config, "sliding_window", None))

        def forward(hidden: torch.Tensor, on_linear: LinearHook) -> torch.Tensor:
            positions = torch.arange(hidden.shape[1], device=self.device).unsqueeze(0)
            with _hooks({m: _forward_hook(sub, on_linear) for sub, m in linears.items()}):
                return module(hidden, attention_mask=self._mask(hidden.shape[1], window), position_ids=positions,
                              position_embeddings=rotary(hidden, positions))

        return Layer({sub: (m.weight, m.bias) for sub, m in linears.items()}, forward)

    def _rotary_tables(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        if tokens not in self._rotary:
            self._rotary[tokens] = rotary_tables(self.model.hf, tokens, self.dtype, self.device)
        return self._rotary[tokens]

    def _mask(self, tokens: int, window: int | None) -> torch.Tensor:
        key = (tokens, window)
        if key not in self._masks:
            query = torch.arange(tokens, device=self.device).unsqueeze(1)
            keys = torch.arange(tokens, device=self.device).unsqueeze(0)
            hidden = keys > query
            if window is not None:
                hidden |= keys <= query - window
            mask = torch.zeros((tokens, tokens), dtype=self.dtype, device=self.device)
            self._masks[key] = mask.masked_fill_(hidden, torch.finfo(self.dtype).min)[None, None]
        return self._masks[key]


def _forward_hook(name: str, on_linear: LinearHook) -> Callable[..., None]:
    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        on_linear(name, inputs[0], output)
    return hook


@contextmanager
def _hooks(hooks: dict[torch.nn.Module, Callable[..., None]]) -> Iterator[None]:
    handles = [module.register_forward_hook(hook) for module, hook in hooks.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
