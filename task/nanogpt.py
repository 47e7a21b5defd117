"""A character-level GPT in the style of karpathy/nanoGPT.

Paper setting for Tiny Shakespeare: 4 transformer layers, 4 heads, embedding
size 16, context 64.  Pre-LayerNorm blocks (causal self-attention + 4x MLP with
GELU), learned token and position embeddings, a final LayerNorm and a linear
head without bias.

The head is **not tied** to the token embedding by default
(``tie_weights=False``): untied, every entry of ``state_dict()`` is a distinct
trainable parameter, one-to-one with ``named_parameters()``, which keeps
federated averaging, coded storage and per-parameter (Fisher) updates simple.
With ``tie_weights=True`` (nanoGPT's choice) the head shares the embedding
matrix, and ``state_dict()`` then lists that one tensor under two keys
(``wte.weight`` and ``lm_head.weight``).  The default model has 16,256
parameters for a vocabulary of 65 (15,216 tied).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class GPTConfig:
    """Size of a :class:`CharGPT`.

    Attributes
    ----------
    vocab_size : int
        Number of distinct characters (65 for Tiny Shakespeare).
    block_size : int
        Longest context ``T`` (positions embedded).
    n_layer, n_head, n_embd : int
        Transformer layers, attention heads, embedding width (``n_embd``
        divisible by ``n_head``).
    dropout : float
        Dropout probability (0 in the paper setting).
    tie_weights : bool
        Share the head's weight with the token embedding (default False).
    """

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 16
    dropout: float = 0.0
    tie_weights: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} must be in [0, 1)")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t only."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map float (B, T, n_embd) to float (B, T, n_embd)."""
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward layer, width 4 * n_embd, GELU."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map float (B, T, n_embd) to float (B, T, n_embd)."""
        return self.dropout(self.c_proj(nn.functional.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map float (B, T, n_embd) to float (B, T, n_embd)."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CharGPT(nn.Module):
    """Character-level GPT: embeddings, ``n_layer`` blocks, LayerNorm, head.

    Parameters
    ----------
    config : GPTConfig
        Model size; the head is tied to the token embedding only if
        ``config.tie_weights`` (default: untied).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2 scaled residual init
                std = 0.02 / math.sqrt(2 * config.n_layer)
                nn.init.normal_(param, mean=0.0, std=std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-character logits.

        Parameters
        ----------
        idx : torch.Tensor
            int64 character ids, shape (B, T) with ``T <= block_size``.

        Returns
        -------
        torch.Tensor
            float32 logits, shape (B, T, vocab_size); position t depends on
            ``idx[:, :t + 1]`` only.

        Raises
        ------
        ValueError
            If ``idx`` is not 2-D or ``T > block_size``.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T); got {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(
                f"sequence length {t} exceeds block_size={self.config.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
