"""PNG rendering of a `ChartLayout` in pure Python (zlib + a 5x7 bitmap font; no dependencies).

Good enough for a chart per metric next to the HTML report: anti-aliased lines, grid, ticks,
title, legend. Letters are drawn in upper case (the font has one case).
"""

from __future__ import annotations

import math
import struct
import zlib

from rlhfkit.diagnostics.plot import SEVERITY_COLOR, ChartLayout

RGB = tuple[int, int, int]

# 5x7 glyphs: char, then 7 rows ('#' = ink). Lower case maps to upper case.
_FONT_SRC = """
A .###. #...# #...# ##### #...# #...# #...#
B ####. #...# #...# ####. #...# #...# ####.
C .###. #...# #.... #.... #.... #...# .###.
D ####. #...# #...# #...# #...# #...# ####.
E ##### #.... #.... ####. #.... #.... #####
F ##### #.... #.... ####. #.... #.... #....
G .###. #...# #.... #.### #...# #...# .####
H #...# #...# #...# ##### #...# #...# #...#
I .###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.
J ..### ...#. ...#. ...#. ...#. #..#. .##..
K #...# #..#. #.#.. ##... #.#.. #..#. #...#
L #.... #.... #.... #.... #.... #.... #####
M #...# ##.## #.#.# #.#.# #...# #...# #...#
N #...# #...# ##..# #.#.# #..## #...# #...#
O .###. #...# #...# #...# #...# #...# .###.
P ####. #...# #...# ####. #.... #.... #....
Q .###. #...# #...# #...# #.#.# #..#. .##.#
R ####. #...# #...# ####. #.#.. #..#. #...#
S .#### #.... #.... .###. ....# ....# ####.
T ##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..
U #...# #...# #...# #...# #...# #...# .###.
V #...# #...# #...# #...# #...# .#.#. ..#..
W #...# #...# #...# #.#.# #.#.# #.#.# .#.#.
X #...# #...# .#.#. ..#.. .#.#. #...# #...#
Y #...# #...# .#.#. ..#.. ..#.. ..#.. ..#..
Z ##### ....# ...#. ..#.. .#... #.... #####
0 .###. #...# #..## #.#.# ##..# #...# .###.
1 ..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.
2 .###. #...# ....# ...#. ..#.. .#... #####
3 ####. ....# ....# .###. ....# ....# ####.
4 ...#. ..##. .#.#. #..#. ##### ...#. ...#.
5 ##### #.... ####. ....# ....# #...# .###.
6 ..##. .#... #.... ####. #...# #...# .###.
7 ##### ....# ...#. ..#.. .#... .#... .#...
8 .###. #...# #...# .###. #...# #...# .###.
9 .###. #...# #...# .#### ....# ...#. .##..
. ..... ..... ..... ..... ..... .##.. .##..
- ..... ..... ..... .###. ..... ..... .....
+ ..... ..#.. ..#.. ##### ..#.. ..#.. .....
/ ..... ....# ...#. ..#.. .#... #.... .....
_ ..... ..... ..... ..... ..... ..... #####
: ..... .##.. .##.. ..... .##.. .##.. .....
( ...#. ..#.. .#... .#... .#... ..#.. ...#.
) .#... ..#.. ...#. ...#. ...#. ..#.. .#...
, ..... ..... ..... ..... .##.. ..#.. .#...
% ##... ##..# ...#. ..#.. .#... #..## ...##
= ..... ..... ##### ..... ##### ..... .....
? .###. #...# ....# ...#. ..#.. ..... ..#..
x ..... #...# .#.#. ..#.. .#.#. #...# .....
"""
FONT: dict[str, list[str]] = {}
for _line in _FONT_SRC.strip().splitlines():
    _char, *_rows = _line.split()
    FONT[_char] = _rows
FONT[" "] = ["....."] * 7


def _hex(color: str) -> RGB:
    color = color.lstrip("#")
    return (int(color[0:2], 16), int(color[2:4], 16), int(color[4:6], 16))


class Canvas:
    """An RGB image with alpha blending, anti-aliased lines and bitmap text."""

    def __init__(self, width: int, height: int, background: RGB = (255, 255, 255)) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def blend(self, x: int, y: int, color: RGB, alpha: float = 1.0) -> None:
        if 0 <= x < self.width and 0 <= y < self.height and alpha > 0:
            i = 3 * (y * self.width + x)
            a = min(alpha, 1.0)
            p = self.pixels
            p[i] = int(p[i] + (color[0] - p[i]) * a + 0.5)
            p[i + 1] = int(p[i + 1] + (color[1] - p[i + 1]) * a + 0.5)
            p[i + 2] = int(p[i + 2] + (color[2] - p[i + 2]) * a + 0.5)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: RGB, alpha: float = 1.0) -> None:
        for y in range(max(0, int(y0)), min(self.height, int(math.ceil(y1)))):
            for x in range(max(0, int(x0)), min(self.width, int(math.ceil(x1)))):
                self.blend(x, y, color, alpha)

    def hline(self, x0: float, x1: float, y: float, color: RGB, dash: int = 0) -> None:
        for x in range(int(x0), int(x1) + 1):
            if not dash or (x // dash) % 2 == 0:
                self.blend(x, int(y), color)

    def vline(self, x: float, y0: float, y1: float, color: RGB, dash: int = 0) -> None:
        for y in range(int(y0), int(y1) + 1):
            if not dash or (y // dash) % 2 == 0:
                self.blend(int(x), y, color)

    def polyline(self, points: list[tuple[float, float]], color: RGB, width: float = 1.8) -> None:
        """Anti-aliased polyline: per-pixel coverage from the distance to the nearest segment."""
        half = width / 2
        cover: dict[tuple[int, int], float] = {}
        for (ax, ay), (bx, by) in zip(points, points[1:]):
            dx, dy = bx - ax, by - ay
            length2 = dx * dx + dy * dy
            for y in range(int(min(ay, by) - half - 1), int(max(ay, by) + half + 2)):
                for x in range(int(min(ax, bx) - half - 1), int(max(ax, bx) + half + 2)):
                    cx, cy = x + 0.5, y + 0.5
                    t = 0.0 if length2 == 0 else max(0.0, min(1.0, ((cx - ax) * dx + (cy - ay) * dy) / length2))
                    d = math.hypot(cx - (ax + t * dx), cy - (ay + t * dy))
                    a = half + 0.5 - d
                    if a > 0 and a > cover.get((x, y), 0.0):
                        cover[(x, y)] = a
        for (x, y), a in cover.items():
            self.blend(x, y, color, a)

    def dot(self, cx: float, cy: float, r: float, color: RGB) -> None:
        for y in range(int(cy - r - 1), int(cy + r + 2)):
            for x in range(int(cx - r - 1), int(cx + r + 2)):
                self.blend(x, y, color, r + 0.5 - math.hypot(x + 0.5 - cx, y + 0.5 - cy))

    def text(self, x: float, y: float, s: str, color: RGB, scale: int = 1, anchor: str = "left") -> None:
        """Draw ``s`` with its top at ``y``; anchor "left" | "middle" | "right" at ``x``."""
        width = len(s) * 6 * scale - scale
        if anchor == "middle":
            x -= width / 2
        elif anchor == "right":
            x -= width
        for n, ch in enumerate(s):
            glyph = FONT.get(ch) or FONT.get(ch.upper()) or FONT["?"]
            gx = int(x) + n * 6 * scale
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        for yy in range(scale):
                            for xx in range(scale):
                                self.blend(gx + col * scale + xx, int(y) + row * scale + yy, color)

    def to_png(self) -> bytes:
        raw = bytearray()
        stride = 3 * self.width
        for y in range(self.height):
            raw.append(0)  # filter: none
            raw += self.pixels[y * stride:(y + 1) * stride]

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 6))
                + chunk(b"IEND", b""))


def render_png(layout: ChartLayout) -> bytes:
    """The chart as PNG bytes."""
    c = Canvas(layout.width, layout.height)
    ink, grey, light = (40, 40, 40), (110, 110, 110), (228, 228, 228)
    x0, y0, x1, y1 = layout.box
    c.text(x0, 6, layout.title, ink, scale=2 if len(layout.title) * 12 < layout.width - x0 else 1)
    if layout.empty:
        c.text(layout.width / 2, layout.height / 2, "no data", grey, anchor="middle")
        return c.to_png()
    for y, label in layout.yticks:
        c.hline(x0, x1, y, light)
        c.text(x0 - 5, y - 3, label, grey, anchor="right")
    for x, label in layout.xticks:
        c.vline(x, y1, y1 + 4, grey)
        c.text(x, y1 + 8, label, grey, anchor="middle")
    c.hline(x0, x1, y0, grey)
    c.hline(x0, x1, y1, grey)
    c.vline(x0, y0, y1, grey)
    c.vline(x1, y0, y1, grey)
    for x, severity, _tip in layout.markers:
        c.vline(x, y0, y1, _hex(SEVERITY_COLOR.get(severity, "#888888")), dash=4)
    for color, runs in layout.lines:
        for run in runs:
            c.polyline(run, _hex(color))
    for color, x, y in layout.dots:
        c.dot(x, y, 2.2, _hex(color))
    for _color, x, _tip in layout.nonfinite:
        c.text(x, y1 - 10, "x", (214, 39, 40), anchor="middle")
    lx = x0
    for color, label in layout.legend:
        c.rect(lx, 25, lx + 9, 34, _hex(color))
        c.text(lx + 13, 26, label, ink)
        lx += 13 + 6 * len(label) + 12
    return c.to_png()
