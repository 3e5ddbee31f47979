"""What the book's figures share (`style`: how a method is drawn, the schematics' greys, sizes
and direct labels). A figure is drawn in the chapter that shows it, where its reader can open
its code."""
from . import style

__all__ = ["style"]
