"""The report stage: Markdown/HTML/CSV reports, run comparison and the CI gate."""
