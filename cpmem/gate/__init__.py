"""The estimator gate: golden cells to priced inputs, checks, targets, power studies,
controls, fitting and reports.

May import everything above it (model, plan, pricing, admission, golden).
"""
