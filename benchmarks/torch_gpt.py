"""The npddp GPT written in PyTorch eager mode, with weights copied from an npddp model.

Used by ``benchmarks/nn.py`` (time side by side) and the torch-agreement tests. ``torch`` is
imported by the caller and passed in, so importing this module never needs it.

``attention="manual"`` computes ``softmax(mask(q k^T / sqrt(d/h))) v`` with explicit
matmuls, the same algorithm as npddp; ``"sdpa"`` calls
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, PyTorch's fused kernel.
"""

from __future__ import annotations

import math

ATTENTIONS = ("manual", "sdpa")


def build(torch, model, attention: str = "manual"):
    """A ``torch.nn.Module`` computing what npddp ``model`` (a GPT) computes, from a copy of its weights."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    nn, F = torch.nn, torch.nn.functional
    cfg = model.config

    def dtype_of(layer):
        return torch.float64 if layer.dtype.name == "float64" else torch.float32

    def copied(tmod, layer):
        """``tmod`` with every parameter copied from the npddp ``layer`` of the same parameter names."""
        with torch.no_grad():
            for name, p in layer.named_parameters():
                tmod.get_parameter(name).copy_(torch.tensor(p.data))
        return tmod

    def linear(layer):
        return copied(nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                dtype=dtype_of(layer)), layer)

    def layer_norm(ln):
        return copied(nn.LayerNorm(ln.d, eps=ln.eps, dtype=dtype_of(ln)), ln)

    def embedding(emb):
        return copied(nn.Embedding(emb.num_embeddings, emb.embedding_dim, dtype=dtype_of(emb)), emb)

    class Attention(nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.h = attn.num_heads
            self.qkv, self.proj = linear(attn.qkv), linear(attn.proj)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (a.view(b, t, self.h, d // self.h).transpose(1, 2) for a in (q, k, v))  # (B, h, T, dh)
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))                 # (B, h, T, T)
                mask = torch.ones(t, t, dtype=torch.bool).triu(1)
                y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.ln1, self.attn, self.ln2 = layer_norm(blk.ln1), Attention(blk.attn), layer_norm(blk.ln2)
            self.mlp = nn.Sequential(linear(blk.mlp[0]), nn.GELU(approximate=blk.mlp[1].approximate),
                                     linear(blk.mlp[2]))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb, self.pos_emb = embedding(model.tok_emb), embedding(model.pos_emb)
            self.blocks = nn.ModuleList(Block(b) for b in model.blocks)
            self.ln_f = layer_norm(model.ln_f)
            if cfg["tie_weights"]:
                self.head = nn.Linear(cfg["d_model"], cfg["vocab_size"], bias=False, dtype=dtype_of(model.ln_f))
                self.head.weight = self.tok_emb.weight
            else:
                self.head = linear(model.head)

        def forward(self, idx):
            x = self.tok_emb(idx) + self.pos_emb.weight[:idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return GPT()


def grads(torch_model) -> dict:
    """Parameter name (the same names as npddp's) -> gradient as a NumPy array."""
    return {name: p.grad.detach().numpy() for name, p in torch_model.named_parameters() if p.grad is not None}
