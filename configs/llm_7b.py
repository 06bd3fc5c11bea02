"""LLaMA-2-7B shape (6.74B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_7b.py --print_config
    axtrain --config=configs/llm_7b.py --mesh=gpu-h100-8
    axtrain plan --config=configs/llm_7b.py --mesh=tpu-v5p-128
"""

from configs import llama
from core.config_args import parse_arg


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments (configs/llama.py:size=NAME reaches every size)
  return llama.get_config("size=7b")
