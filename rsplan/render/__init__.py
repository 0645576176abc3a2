"""Renderers: turn plans into text tables, JSON and (lazily) plotly reports. Units appear only here."""
