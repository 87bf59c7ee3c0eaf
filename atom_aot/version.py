__version__ = "0.1.0"
ARTIFACT_FORMAT_VERSION = 3
