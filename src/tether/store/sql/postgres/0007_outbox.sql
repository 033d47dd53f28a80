-- Placeholder: filled in by the change that adds this concept.
SELECT 1;
