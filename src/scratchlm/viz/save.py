"""Atomic PNG writing for matplotlib figures."""

from __future__ import annotations

import io
from pathlib import Path

from scratchlm.io_utils import atomic_write


def save_figure(fig, out: str | Path, dpi: int = 120) -> Path:
    """Render `fig` to PNG bytes, write them atomically to `out`, close the figure; return the path."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    with atomic_write(out) as f:
        f.write(buf.getvalue())
    return Path(out)
