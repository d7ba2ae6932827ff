"""The pipeline: its description (``Dataset``), its read plan and its iterator."""
