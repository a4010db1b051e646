"""The tiny run of the tools' tests (test_tensorboard.py, test_wandb.py): its config file."""
import os


def write_config(work, steps, checkpoint_interval, log_interval, tensorboard=True):
    """WORK/config.yaml: a 2-layer model of hidden size 32 on WORK/data (train and valid), an
    evaluation of one batch every 4 steps, checkpoints and logs under WORK. Returns its path."""
    path = os.path.join(work, "config.yaml")
    with open(path, "w") as f:
        f.write(f"""
model: {{hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 8, vocab_size: 257, max_seq_len: 64}}
data: {{train: [{{path: {work}/data}}], valid: [{{path: {work}/data}}], seq_len: 16}}
train: {{steps: {steps}, global_batch: 4, micro_batch: 2, eval_interval: 4, eval_steps: 1}}
optim: {{lr: 3.0e-3, warmup_steps: 2}}
checkpoint: {{dir: {work}/ckpt, interval: {checkpoint_interval}}}
log: {{dir: {work}/log, interval: {log_interval}, tensorboard: {str(tensorboard).lower()}}}
""")
    return path
