"""The model run one decoder layer at a time, as llm-compressor's sequential pipeline and AutoAWQ do: the embedding
runs once over the calibration windows; then each decoder layer is built from ``transformers``' own class for the
family, its weights read from the safetensors files (``pread`` of their byte ranges, nothing else of the file is
touched), run over every window, and freed; its outputs are the next layer's inputs. Memory follows one layer's
weights in the compute dtype plus the windows' hidden states, never the model, so one GPU or a plain CPU box
calibrates a model of any size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from trtllm_kit.errors import CheckpointError
from trtllm_kit.models.inspect import ModelSpec, TensorInfo

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
class LayerStream:
    """Builds the model's pieces one at a time on ``device`` in ``dtype``.

    Arguments:
        model: the inspected HF model; dtype: the compute dtype; device: a torch device.
    """

    model: ModelSpec
    dtype: torch.dtype
    device: str
    _config: Any = field(init=False, repr=False)
    _layer_class: type = field(init=False, repr=False)
    _rotary: torch.nn.Module = field(init=False, repr=False)
    _masks: dict[tuple[int, int | None], torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(self.model.path), trust_remote_code=False)
        config._attn_implementation = "eager"  # the explicit mask below; sdpa would pick its own kernel
        with torch.device("meta"):  # the classes the family's model is made of; no weights exist
            skeleton = AutoModelForCausalLM.from_config(config)
        self._config = config
        self._layer_class = type(skeleton.model.layers[0])
        rotary_class = type(skeleton.model.rotary_emb)
        self._rotary = rotary_class(config=config).to(self.device)

    @property
    def num_layers(self) -> int:
        return self.model.hf.num_hidden_layers

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

    def build_layer(self, index: int, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
        """``transformers``' decoder layer ``index`` holding ``weights`` in the compute dtype, on the device, eval.

        Arguments:
            index: the decoder layer; weights: from ``layer_weights``.
        """
        with torch.device("meta"):
            layer = self._layer_class(self._config, index)
        state = {name: t.to(self.device, self.dtype) for name, t in weights.items()}
        try:
            layer.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as exc:
            raise CheckpointError(f"layer {index} of {self.model.path} does not match its config.json "
                                  f"({str(exc).splitlines()[0]}); the checkpoint is incomplete or of another "
                                  "model.") from None
        return layer.eval()

    def run(self, layer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """One layer over a batch of windows, causal (and sliding-window where the layer has one).

        Arguments:
            layer: from ``build_layer``; hidden: [windows, tokens, hidden] on the device.
        """
        tokens = hidden.shape[1]
        positions = torch.arange(tokens, device=self.device).unsqueeze(0)
        position_embeddings = self._rotary(hidden, positions)
        window = getattr(layer.self_attn, "sliding_window", getattr(self._config, "sliding_window", None))
        mask = self._mask(tokens, window)
        return layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=position_embeddings)

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
