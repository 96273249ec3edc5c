"""Evaluation stage: BEIR-layout datasets, pytrec_eval metrics, Q2Q/Q2D/bitext runs and reports."""
