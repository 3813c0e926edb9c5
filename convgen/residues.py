"""dgrad's stride residue classes, as the host sees them.

With stride > 1, filter tap r reaches input row h only when h + padding - r*dilation is a
multiple of the stride.  Splitting dx's pixels by (h mod SH, w mod SW) gives each class a
fixed set of taps, an arithmetic progression along each axis, and makes the class a
stride-1 correlation of dy with that sub-filter (CUTLASS's strided dgrad): no multiply is
spent on the zero-inserted positions.  The kernels derive the same facts at compile time
(``parts/dgrad_classes.j2``); the host needs them too, for the TMA loop's per-class tensor
maps (:mod:`convgen.tma`), the cost model's work per class, and the launch order, and the
TMA kernel checks the two derivations agree with ``static_assert``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ir import ConvGeometry


@dataclass(frozen=True)
class Taps:
    """The taps along one axis that reach a class: ``first``, ``first + step``, ... (``count``)."""

    first: int
    step: int
    count: int


def _taps(c: int, pad: int, dil: int, stride: int, extent: int) -> Taps:
    hits = [t for t in range(extent) if (c + pad - t * dil) % stride == 0]
    return Taps(hits[0] if hits else 0, stride // math.gcd(stride, dil), len(hits))


@dataclass(frozen=True)
class ResidueClass:
    """dx's pixels (h, w) with h = ch (mod SH) and w = cw (mod SW): an ``hc`` x ``wc`` grid,
    reached by ``th.count`` x ``tw.count`` taps.  Under the class's flipped sub-filter, the
    class pixel (i, j) reads dy at (i - flip_h + a*pstep, j - flip_w + b*qstep) for its a-th
    and b-th flipped taps (a stride-1 correlation whose padding is ``flip_h``, ``flip_w``)."""

    ch: int
    cw: int
    th: Taps
    tw: Taps
    hc: int
    wc: int
    pstep: int  # dy rows between the class's successive row taps
    qstep: int
    flip_h: int  # the flipped sub-filter's padding: (count - 1) * pstep - (dy row of the first tap at i = 0)
    flip_w: int

    @property
    def taps(self) -> int:
        return self.th.count * self.tw.count

    @property
    def pixels_per_image(self) -> int:
        return self.hc * self.wc

    def tap(self, a: int, b: int) -> tuple[int, int]:
        """The filter tap (r, s) of the class's a-th and b-th flipped taps."""
        return (self.th.first + (self.th.count - 1 - a) * self.th.step,
                self.tw.first + (self.tw.count - 1 - b) * self.tw.step)


def residue_classes(g: ConvGeometry) -> tuple[ResidueClass, ...]:
    """Every class of ``g``'s dx, in launch order: most taps first, so the longest blocks
    start first and the short ones fill the last wave (ties in (ch, cw) order)."""
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    out = []
    for ch in range(sh):
        for cw in range(sw):
            th, tw = _taps(ch, ph, dh, sh, g.r), _taps(cw, pw, dw, sw, g.s)
            # dy's row under the first tap for class row 0: exact, by the class's definition
            off_h, off_w = (ch + ph - th.first * dh) // sh, (cw + pw - tw.first * dw) // sw
            pstep, qstep = th.step * dh // sh, tw.step * dw // sw
            out.append(ResidueClass(
                ch=ch, cw=cw, th=th, tw=tw,
                hc=-(-(g.h - ch) // sh) if ch < g.h else 0, wc=-(-(g.w - cw) // sw) if cw < g.w else 0,
                pstep=pstep, qstep=qstep,
                flip_h=(th.count - 1) * pstep - off_h, flip_w=(tw.count - 1) * qstep - off_w,
            ))
    return tuple(sorted(out, key=lambda c: -c.taps))
