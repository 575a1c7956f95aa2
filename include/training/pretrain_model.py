"""The model (HF BertForPreTraining from an explicit config), its placement on the device, the
pretraining loss, the optimizers and the learning-rate schedule."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pretrain_runtime import UsageError

COMMON_CONFIG = dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
                     hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, initializer_range=0.02,
                     layer_norm_eps=1e-12)
MODEL_SIZES = {
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512),
}

class PretrainingLoss(torch.nn.Module):
    """BertForPreTraining's MLM + NSP loss, scoring only the masked positions.

    Gathering the <= 20 masked positions before the vocabulary projection avoids computing
    128 x 30522 logits per sequence for nothing; the losses equal BertForPreTraining's.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids,
                next_sentence_labels):
        outputs = self.model.bert(input_ids=input_ids, attention_mask=input_mask,
                                  token_type_ids=segment_ids)
        hidden = outputs.last_hidden_state
        index = masked_lm_positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1))
        masked_hidden = torch.gather(hidden, 1, index)
        mlm_scores, nsp_scores = self.model.cls(masked_hidden, outputs.pooler_output)
        # Padding slots of masked_lm_ids are 0 ([PAD]), never a real prediction target.
        labels = masked_lm_ids.masked_fill(masked_lm_ids == 0, -100)
        mlm_loss = F.cross_entropy(mlm_scores.float().flatten(0, 1), labels.flatten(),
                                   ignore_index=-100)
        nsp_loss = F.cross_entropy(nsp_scores.float(), next_sentence_labels)
        return mlm_loss + nsp_loss


def build_model(size: str, attn_implementation: str | None = None):
    """attn_implementation "eager" on XLA: the SDPA path tests the attention mask for all-ones
    on the host (torch.all(mask == 1)), a device-to-host transfer in every forward."""
    from transformers import BertConfig, BertForPreTraining  # slow import: only when training
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    config = BertConfig(**COMMON_CONFIG, **MODEL_SIZES[size], **extra)
    return BertForPreTraining(config), config


def parameter_count(model) -> int:
    """Distinct parameters (a tied weight counts once, as model.parameters() yields it once)."""
    return sum(p.numel() for p in model.parameters())


def weights_tied(model) -> bool:
    head = model.cls.predictions
    return (head.decoder.weight is model.bert.embeddings.word_embeddings.weight
            and head.decoder.bias is head.bias)


def place_model(model, device, dtype):
    """Move (and cast) the model, then tie the MLM decoder to the word embeddings again.

    Moving to an XLA device replaces each parameter with a new one, so the decoder's weight and
    bias stop being the embeddings' and the head's (31 M extra parameters for BERT-Large). The
    Neuron sample re-ties the same two after the move.
    """
    model.to(device=device, dtype=dtype)
    model.tie_weights()
    model.cls.predictions.decoder.bias = model.cls.predictions.bias
    if not weights_tied(model):
        raise UsageError("the MLM decoder is not tied to the word embeddings after the move to "
                         f"{device}: this transformers version ties them differently")
    return model


def _adam_direction(state, p, group):
    """Update the fp32 Adam moments of p with its gradient; return m_hat / (sqrt(v_hat) + eps)."""
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
    state["step"] += 1
    beta1, beta2 = group["betas"]
    grad, exp_avg, exp_avg_sq, step = p.grad.float(), state["exp_avg"], state["exp_avg_sq"], state["step"]
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    m_hat = exp_avg / (1 - beta1 ** step)
    v_hat = exp_avg_sq / (1 - beta2 ** step)
    return m_hat / (v_hat.sqrt() + group["eps"])


class FP32Moments(torch.optim.Optimizer):
    """Adam-moment optimizers written with tensor ops only (no .item(): one XLA graph, no host
    sync), whose moments stay fp32 whatever the parameters' dtype, also across a resume (torch's
    load_state_dict casts loaded states to the parameter's dtype)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, _adam_direction(self.state[p], p, group))
        return loss

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        for p, saved_id in zip(params, saved_ids):
            saved = state_dict["state"].get(saved_id, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in saved:
                    self.state[p][key] = saved[key].to(device=p.device, dtype=torch.float32)


class AdamW(FP32Moments):
    """AdamW (decoupled weight decay). Unlike torch.optim.AdamW: fp32 moments for bf16 weights and
    no .item() of the step count (a host sync per step on XLA)."""

    def _update(self, p, group, direction):
        weight = p.float()
        p.copy_(weight - group["lr"] * (direction + group["weight_decay"] * weight))


class Lamb(FP32Moments):
    """LAMB (You et al., 2019): Adam moments, update scaled per tensor by ||w|| / ||update||."""

    def _update(self, p, group, update):
        if group["weight_decay"]:
            update.add_(p.float(), alpha=group["weight_decay"])
        weight_norm = p.float().norm()
        update_norm = update.norm()
        trust = torch.where((weight_norm > 0) & (update_norm > 0),
                            weight_norm / update_norm, torch.ones_like(weight_norm))
        p.add_((update * trust * -group["lr"]).to(p.dtype))


def build_optimizer(model, args, tensor_only=False):
    """LAMB, or AdamW: torch's on CPU/CUDA with fp32 weights, ours (fp32 moments, no host sync)
    when tensor_only (XLA) or the weights are not fp32."""
    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    decay, plain = [], []
    for name, param in model.named_parameters():
        (plain if name.endswith(no_decay) else decay).append(param)
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": plain, "weight_decay": 0.0}]
    if args.optimizer == "lamb":
        return Lamb(groups, lr=args.lr)
    if tensor_only or any(p.dtype != torch.float32 for p in model.parameters()):
        return AdamW(groups, lr=args.lr)
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-6)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to the peak, then linear decay to 0 at max_steps (step counts from 0)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))
