"""Library code the algorithms share and the generic folders use with them: the numpy MLP the actors run
(`policy`), TensorFlow networks and their device (`networks`), running normalizers (`normalizer`) and the
evaluation episode loops (`evaluation`). It names no algorithm; importing this package imports no TensorFlow."""
