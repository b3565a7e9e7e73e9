"""Function bodies and translations, below the export pipeline and body derivation: the onnxscript
translation derived from an op's schema, and bodies put into a model at its opset."""
