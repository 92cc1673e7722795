(** Extracts the models to OCaml for the fixture replay and the trace
    generators (replay/): the egress core's, and the latest-value
    projection's. *)
From Coq Require Import Extraction ExtrOcamlBasic ExtrOcamlNatInt.
From Egress Require Import Model Latest.
Extraction Language OCaml.
Extraction "replay/model.ml" step init st_of out_of ch_of lstep linit lst_of lout_of lch_of.
