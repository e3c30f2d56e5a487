"""``pyverbs.qp``: queue pairs and their attribute objects."""

from softverbs.verbs.qp import (
    ECE,
    QP,
    DataBuffer,
    QPAttr,
    QPCap,
    QPEx,
    QPInitAttr,
    QPInitAttrEx,
)

__all__ = ["ECE", "QP", "DataBuffer", "QPAttr", "QPCap", "QPEx", "QPInitAttr", "QPInitAttrEx"]
