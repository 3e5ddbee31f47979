"""Figures. `common` holds the shared style, names and colours; each topic has its own module
(`geometry`: chapters 1-3, `selection`: chapters 4, 5, 8, `results`: chapters 6, 7, 9).
Every function takes tidy tables (pandas) or tensors and returns or draws on matplotlib axes."""
from .common import display_name, method_order, palette, plot_curves

__all__ = ["display_name", "method_order", "palette", "plot_curves"]
