"""Stand-ins for the components the tests do not run (SGLang, the HF Hub) and helpers shared by test folders."""
