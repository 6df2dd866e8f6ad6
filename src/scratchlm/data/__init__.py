"""Data: token files (memmap), batch samplers, chat and preference datasets."""
