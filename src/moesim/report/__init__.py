"""What a run shows a person: text tables (``text``), catalog listings (``listings``) and figures
(``plots``). Sits above ``analysis`` and below the CLI; it computes nothing the analysis layer does."""
