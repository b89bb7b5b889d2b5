"""The CI gate: audits a store from first principles (files, manifests, the pinned recipe, figures, baselines).
It sits above the recipes (it re-reads the recipe each artifact pins) and below the command line."""
