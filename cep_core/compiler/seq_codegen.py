"""What the SEQ code generators (CDP and AIP) share: names of generated locals, and how the
per-channel event columns are read. A subclass sets `schema`, `layout` (a seq_cdp.Layout),
`channels` and `_counter`."""

from __future__ import annotations


class ChannelCodeGenerator:
    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def kind(self, name: str) -> str:
        kind = self.schema.attributes[name]
        return "int" if kind == "timestamp" else kind

    def column(self, channel: int, row: str, name: str) -> str:
        where, col = self.layout.slots[name]
        if where == "f":
            return f"F{channel}[{row}, {col}]"
        if self.schema.attributes[name] == "bool":
            return f"(I{channel}[{row}, {col}] != 0)"
        return f"I{channel}[{row}, {col}]"

    def channel_params(self) -> str:
        return ", ".join(f"I{c}, F{c}" for c in self.channels)

    def arena_params(self) -> str:
        return ", ".join(f"AI{c}, AF{c}" for c in self.channels)

    def fetch_lines(self) -> list[str]:
        return [line for c in self.channels for line in (
            f"I{c} = AI{c}[base[p, {c}]:base[p, {c}] + cnt[p, {c}]]",
            f"F{c} = AF{c}[base[p, {c}]:base[p, {c}] + cnt[p, {c}]]")]
