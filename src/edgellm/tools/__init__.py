"""Model tools: quantize, perplexity, info (click commands in commands.py)."""
